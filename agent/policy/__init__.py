"""agent/policy: see README.md in this folder."""
