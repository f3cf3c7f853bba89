"""Which model plans and researches: the builtin policy, any pydantic-ai model, or an OpenAI-compatible URL."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

LLM_TIMEOUT_S = 120.0
LLM_MAX_RETRIES = 4
"""Transport-level retries (timeouts, 429, 5xx) by the openai SDK, with backoff."""


class ModelChoiceError(ValueError):
    """A model choice that cannot work (e.g. a base URL without a model name and no default)."""


@dataclass
class ModelChoice:
    """The models for the planner and the researcher, and a label for transcripts (no secrets)."""

    planner: Any
    researcher: Any
    label: str


def choose_model(
    name: str | None, base_url: str | None, *, configured: str = "builtin"
) -> tuple[str, str | None]:
    """Resolve `--model`/`--base-url`, the config and `OPENAI_BASE_URL`/`OPENAI_MODEL` to (name, base_url)."""
    base_url = base_url or (
        os.environ.get("OPENAI_BASE_URL") if name is None and configured == "builtin" else None
    )
    if name is None:
        name = configured
        if base_url and name == "builtin":
            name = os.environ.get("OPENAI_MODEL", "default")
    if name == "builtin" and base_url:
        raise ModelChoiceError(
            "--base-url needs an LLM: give --model NAME (the builtin policy uses no endpoint)"
        )
    if base_url:  # the endpoint wants the name it serves: `openai:NAME` is pydantic-ai's spelling
        name = name.removeprefix("openai:")
    return name, base_url


def make_models(name: str, base_url: str | None) -> ModelChoice:
    """Build the pydantic-ai models (imports pydantic-ai: call only from run/chat code paths)."""
    if name == "builtin":
        from pydantic_ai.models.function import FunctionModel

        from agent.policy.builtin.policy import planner_policy, researcher_policy

        return ModelChoice(
            FunctionModel(planner_policy, model_name="builtin-planner"),
            FunctionModel(researcher_policy, model_name="builtin-researcher"),
            "builtin",
        )
    if base_url:
        name = name.removeprefix("openai:")
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        client = AsyncOpenAI(
            base_url=base_url,
            api_key=os.environ.get("OPENAI_API_KEY") or "none",
            timeout=LLM_TIMEOUT_S,
            max_retries=LLM_MAX_RETRIES,
        )
        model = OpenAIChatModel(name, provider=OpenAIProvider(openai_client=client))
        return ModelChoice(model, model, f"{name} @ {base_url}")
    from pydantic_ai.models import infer_model

    try:
        model = infer_model(name)
    except Exception as e:  # unknown provider prefix, missing key: a usage error, not a crash
        raise ModelChoiceError(f"cannot use model {name!r}: {e}") from e
    return ModelChoice(model, model, name)
