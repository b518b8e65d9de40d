"""The token usage an upstream reports, in chat's terms, whatever API answered.

Chat completions report ``prompt_tokens`` and ``completion_tokens``; the Responses API and
Anthropic's Messages ``input_tokens`` and ``output_tokens`` (Anthropic counting cache writes
and reads apart from its ``input_tokens``). Usage is found at an answer's top, or in a stream
event's ``response`` (``response.completed``) or ``message`` (Messages' ``message_start``).
What the provider's prompt cache did with the prompt is in ``prompt_tokens_details`` (chat),
``input_tokens_details`` (Responses: ``cached_tokens``, and from GPT-5.6 ``cache_write_tokens``)
or beside ``input_tokens`` (Anthropic's ``cache_read_input_tokens`` and
``cache_creation_input_tokens``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """Usage in chat's terms (``prompt_tokens``, ``completion_tokens``), also from the
    Responses API's (``input_tokens``, ``output_tokens``); None when it is not usage."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or not ("input_tokens" in usage or "output_tokens" in usage):
        return usage
    converted = {**usage, "completion_tokens": usage.get("output_tokens")}
    if "input_tokens" in usage:
        # Anthropic counts cache writes and reads apart from ``input_tokens``; the prompt is
        # all three (the Responses API's ``input_tokens`` holds its cached tokens already).
        prompt = usage.get("input_tokens")
        if isinstance(prompt, int):
            written = usage.get("cache_creation_input_tokens")
            read = usage.get("cache_read_input_tokens")
            prompt += (written if isinstance(written, int) else 0) + (
                read if isinstance(read, int) else 0
            )
        converted["prompt_tokens"] = prompt
    return converted


def usage_in(event: Any) -> dict[str, Any] | None:
    """The usage an answer or stream event carries: at the top (chat, a Messages answer or
    ``message_delta``), or in its ``response`` (the Responses API's ``response.completed``)
    or ``message`` (Messages' ``message_start``)."""
    if not isinstance(event, dict):
        return None
    found = chat_usage(event.get("usage"))
    for key in ("response", "message"):
        if found is None and isinstance(event.get(key), dict):
            found = chat_usage(event[key].get("usage"))
    return found


def usage_of_body(body: bytes) -> dict[str, Any] | None:
    """``usage`` of a non-streamed answer, if the body is one."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return usage_in(parsed)


class PromptCacheUse(NamedTuple):
    """A prompt's tokens by what the provider's cache did with them: ``read`` from it,
    ``written`` to it, neither (``uncached``). (A tuple: made on every answered request.)"""

    read: int
    written: int
    uncached: int


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0  # not a bool, nor below 0


def prompt_cache_use(usage: dict[str, Any]) -> PromptCacheUse | None:
    """How the upstream's cache served the prompt of ``usage`` (as ``chat_usage`` gives it);
    None without a prompt count. Counts a provider does not report are 0; the uncached rest is
    never negative."""
    prompt = _count(usage.get("prompt_tokens"))
    if not prompt:
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if isinstance(details, dict):
        read, written = details.get("cached_tokens"), details.get("cache_write_tokens")
    else:
        read = usage.get("cache_read_input_tokens")
        written = usage.get("cache_creation_input_tokens")
    if read is None and written is None:  # a provider that reports no cache
        return PromptCacheUse(0, 0, prompt)
    read = min(_count(read), prompt)
    written = min(_count(written), prompt - read)
    return PromptCacheUse(read, written, prompt - read - written)
