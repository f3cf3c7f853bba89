"""How a verdict is decided and how sure it is: the table of named rules (`decide.py`) and each rule's
record on the taught labels that sets its certainty (`calibration.py`, counts in `calibration.toml`)."""
