"""The systemd unit file: its lexer, its parsed form and the EnvironmentFiles it names."""
