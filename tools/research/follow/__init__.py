"""Where a running reader's value goes: into a module global and out through its getter
(`stores`), or only into tests that answer alike with the flag and without it (`alike`)."""
