"""optagent's hands: deterministic, typed tools with no LLM inside."""
