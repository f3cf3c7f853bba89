"""The builtin offline policy: explicit rules over the tools an LLM gets, as pydantic-ai
`FunctionModel`s (`policy.py`), with the researcher's rules (`research.py`), the chat's first pick
(`pick.py`), the written conclusion (`conclusion.py`) and its view of a message history
(`messages.py`)."""
