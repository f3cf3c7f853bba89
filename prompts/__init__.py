"""Prompt templates (Jinja2 files) for the planner, the researcher and the reviewer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPTS_DIR = Path(__file__).parent


def render(name: str, **variables: Any) -> str:
    """Render `prompts/<name>` with strict undefined variables (a missing one raises)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROMPTS_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(name).render(**variables)
