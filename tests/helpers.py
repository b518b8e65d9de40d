"""Helpers the end-to-end tests share: routes to the fake upstream, a chat request through the
real SDK, metric readings."""

from __future__ import annotations

from typing import Any

import openai
from prometheus_client import REGISTRY

# A policy under which pressure is relieved by pruning and summaries alone: for tests of the
# summary path, whose histories masking (on by default) would otherwise relieve first.
MASKING_OFF: dict[str, Any] = {"masking": {"enabled": False}}
# A policy billed as a provider that caches nothing bills: there masks pay at once, so tests of
# masking's mechanics see them whatever a caching provider's prices would choose.
UNCACHED: dict[str, Any] = {"pricing": {"preset": "none"}}


def route(
    upstream_url: str,
    model: str,
    window: int | None = None,
    *,
    api_key_env: str | None = None,
    **policy: Any,
) -> dict[str, Any]:
    """One route to the fake upstream: the ``model`` pattern, its ``context_window`` when
    given, the key it holds when named, and ``policy`` overrides when there are any."""
    entry: dict[str, Any] = {"model": model, "base_url": upstream_url}
    if window is not None:
        entry["context_window"] = window
    if api_key_env is not None:
        entry["api_key_env"] = api_key_env
    if policy:
        entry["policy"] = policy
    return entry


def counter(name: str, **labels: str) -> float:
    """A metric's value in this process's registry (0 before its first event)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def chat(
    base_url: str, messages: list[dict[str, Any]], model: str, key: str = "sk-test", **extra: Any
) -> Any:
    """One chat completion through the real openai SDK; the raw response (headers and all)."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
        return await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            **extra,
        )
