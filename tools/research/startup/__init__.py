"""SGLang's own start-up decisions: its argument parsing and resolution, run on the deployment's
hardware facts in an isolated worker (see README.md in this folder)."""
