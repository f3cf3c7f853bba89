"""Prompt templates (Jinja2 files) for the planner, the researcher and the reviewer."""

from pathlib import Path

PROMPTS_DIR = Path(__file__).parent
