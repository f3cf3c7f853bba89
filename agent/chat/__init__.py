"""agent/chat: see README.md in this folder."""
