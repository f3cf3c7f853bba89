"""The resolver worker: runs inside its own venv (see `tools.research.startup.resolver`), imports only
the standard library, the venv's real packages and the SGLang tree; never `tools` or `agent`."""
