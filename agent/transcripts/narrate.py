"""`transcripts review --narrate`: an LLM's written analysis of a session's decisions."""

from __future__ import annotations

import os
from typing import Any

from prompts import PROMPTS_DIR


class NoModelError(Exception):
    """No LLM is configured; the message says how to configure one."""


def render_prompt(review_markdown: str, *, max_words: int = 600) -> str:
    """The reviewer's instructions (`prompts/review.md.j2`) with the structured review filled in."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    template = env.from_string((PROMPTS_DIR / "review.md.j2").read_text())
    return template.render(review=review_markdown, max_words=max_words)


def review_model(model: str | None, *, base_url: str | None = None) -> Any:
    """The pydantic-ai model for narration; `NoModelError` when only the builtin policy is available."""
    base_url = base_url or os.environ.get("OPENAI_BASE_URL")
    if (not model or model == "builtin") and not base_url:
        raise NoModelError(
            "no LLM is configured (the builtin policy cannot write prose); pass --model NAME, or "
            "--base-url URL / OPENAI_BASE_URL for an OpenAI-compatible endpoint"
        )
    if base_url:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        name = model if model and model != "builtin" else "default"
        name = name.split(":", 1)[1] if name.startswith("openai:") else name
        provider = OpenAIProvider(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "none")
        return OpenAIChatModel(name, provider=provider)
    return model


def narrate_review(review_markdown: str, *, model: str | None, base_url: str | None = None) -> str:
    """Ask the configured LLM for the analysis; the structured review is the only input it sees."""
    from pydantic_ai import Agent

    agent = Agent(review_model(model, base_url=base_url), name="reviewer", retries=2)
    result = agent.run_sync(render_prompt(review_markdown))
    return str(result.output).strip()
