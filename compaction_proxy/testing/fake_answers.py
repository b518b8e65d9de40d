"""What the fake provider says, as plain functions: OpenAI's error bodies (a context overflow,
tool calls left unanswered) and the answer to a summary call."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from compaction_proxy.compaction.summarize import INSTRUCTION_OPENING, KEPT_NOTE, SECTIONS
from compaction_proxy.parsing import jsonio


def overflow_body(
    window: int, prompt_tokens: int, completion_tokens: int = 0, *, states_limit: bool = True
) -> bytes:
    """OpenAI's exact context-overflow error body (its newer wording states no limit)."""
    if not states_limit:
        message = (
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again."
        )
    elif completion_tokens:
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, "
            f"{completion_tokens} in the completion). Please reduce the length of the messages "
            "or completion."
        )
    else:
        message = (
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
    error = {
        "message": message,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    return orjson.dumps({"error": error})


_UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to "
    "each 'tool_call_id'. The following tool_call_ids did not have response messages: {ids}"
)
_ORPHAN = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
    "with 'tool_calls'."
)


def pairing_error(messages: Any) -> str | None:
    """OpenAI's complaint about ``messages``, if any: every assistant ``tool_calls`` must be
    followed at once by a ``tool`` message for each of its ids, and a ``tool`` message must
    answer such a call."""
    pending: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        role = message.get("role") if isinstance(message, dict) else None
        if pending and role != "tool":
            return _UNANSWERED.format(ids=", ".join(pending))
        if role == "assistant":
            calls = message.get("tool_calls") or []
            pending = [str(c.get("id")) for c in calls if isinstance(c, dict)]
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            if call_id not in pending:
                return _ORPHAN
            pending.remove(call_id)
    return _UNANSWERED.format(ids=", ".join(pending)) if pending else None


_FACT = re.compile(r"FACT-\d+:[^\n<]*")


def _turns(body: Mapping[str, Any]) -> list[Any]:
    """A chat or Messages body's messages; a Responses body's input items, each as a message
    holding its text (a call's arguments, an output's output)."""
    if "input" not in body:
        messages = body.get("messages") or []
        return messages if isinstance(messages, list) else []
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    turns: list[Any] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            text = item.get("content", item.get("output", item.get("arguments")))
            turns.append({"role": item.get("role", "tool"), "content": text})
    return turns


def is_summary_request(body: Mapping[str, Any]) -> bool:
    """Whether ``body`` (chat, Messages or Responses) asks for the proxy's summary."""
    messages = _turns(body)
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, str) and content.startswith(INSTRUCTION_OPENING)


def fake_summary(body: Mapping[str, Any]) -> str:
    """A checkpoint with the requested sections that keeps every ``FACT-n: ...`` line of
    what it replaces (the messages the instruction says stay are left out, as asked)."""
    messages = _turns(body)
    instruction = messages[-1].get("content") if messages else None
    if isinstance(instruction, str) and KEPT_NOTE in instruction:
        replaced = len(messages) - 1
        while replaced and messages[replaced - 1].get("role") != "assistant":
            replaced -= 1
        messages = [*messages[:replaced], messages[-1]]
    facts: list[str] = []
    for message in messages[:-1]:
        for fact in _FACT.findall(readable(message.get("content") or "")):
            if fact.strip() not in facts:
                facts.append(fact.strip())
    lines: list[str] = []
    for section in SECTIONS:
        lines.append(f"## {section}")
        if section == "Critical Context" and facts:
            lines.extend(f"- {fact}" for fact in facts)
        elif section == "Current Work":
            lines.append(f"- Condensed {len(messages) - 1} earlier messages.")
        else:
            lines.append("None.")
    return "\n".join(lines)


def readable(content: Any) -> str:
    """A message's content as a model reads it: a string as it is; blocks (Messages) or parts
    (chat) each by its text or content, one a line; anything else as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            readable(part.get("text", part.get("content", part)))
            if isinstance(part, dict)
            else readable(part)
            for part in content
        )
    return text_of(content)


def text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    return jsonio.dumps(value).decode()
