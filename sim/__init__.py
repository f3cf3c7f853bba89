"""A simulated SGLang deployment: the embedded default target for runs and tests."""
