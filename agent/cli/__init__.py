"""The `optagent` command line: one module per command group, registered in `main`."""
