"""agent/trial: see README.md in this folder."""
