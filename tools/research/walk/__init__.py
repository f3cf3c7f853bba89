"""Walking one source file for the flag index: `file.walk_file` (reads, calls, exits, guards) and
`names` (how a function or module uses a name: tables of classes, membership and type tests)."""
