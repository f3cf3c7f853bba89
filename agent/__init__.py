"""optagent's judgement: agents, trial runner, sessions, transcripts and the CLI."""
