"""tools/research: see README.md in this folder."""
