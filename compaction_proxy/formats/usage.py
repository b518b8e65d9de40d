"""The token usage an upstream reports, in chat's terms, whatever API answered.

Chat completions report ``prompt_tokens`` and ``completion_tokens``; the Responses API and
Anthropic's Messages ``input_tokens`` and ``output_tokens`` (Anthropic counting cache writes
and reads apart from its ``input_tokens``). Usage is found at an answer's top, or in a stream
event's ``response`` (``response.completed``) or ``message`` (Messages' ``message_start``).
"""

from __future__ import annotations

from typing import Any

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
        cached = [usage.get(k) for k in ("cache_creation_input_tokens", "cache_read_input_tokens")]
        prompt = usage.get("input_tokens")
        if isinstance(prompt, int):
            prompt += sum(n for n in cached if isinstance(n, int))
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
