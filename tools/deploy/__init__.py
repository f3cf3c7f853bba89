"""tools/deploy: see README.md in this folder."""
