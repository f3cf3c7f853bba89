"""agent/transcripts: see README.md in this folder."""
