"""Anthropic's ``context_management`` in its own shapes (pure): the ``edits`` a request asks
for, the ``compaction`` block, and the answer carrying the block, ``applied_edits`` and
``usage.iterations``.

Served here (``native_compaction``): ``clear_tool_uses_20250919`` (its ``trigger``, ``keep``,
``clear_at_least``, ``exclude_tools`` and ``clear_tool_inputs``), ``clear_thinking_20251015``
(its ``keep``) and ``compact_20260112`` (its ``trigger``, ``pause_after_compaction`` and
``instructions``).

The block the proxy makes carries its sealed token (``formats.sealed_checkpoints``) as
``encrypted_content`` beside the summary as ``content``. Sent back, the API drops everything
before it: the proxy puts the checkpoint, as a user turn, in place of that history and of the
block, keeping what follows the block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.formats.answer_edits import EventEditor, sse_event
from compaction_proxy.formats.asked_compaction import (
    AskedCompaction,
    ClearedToolUses,
    ClearToolUses,
)
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.sealed_checkpoints import ForgedCheckpoint, MadeCompaction, is_sealed
from compaction_proxy.frozen import frozen

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
EDITS = (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT)
BLOCK_TYPE = "compaction"
DEFAULT_COMPACT_TRIGGER = 150_000
PAUSED = "compaction"  # the stop reason of an answer paused after its compaction


def _invalid(param: str, message: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param, code="invalid_request_error")


def _count(edit: dict[str, Any], name: str, kinds: tuple[str, ...], param: str) -> int | None:
    """``edit[name]``, a ``{"type": kind, "value": n}`` object, as (kind-checked) n."""
    given = edit.get(name)
    if given is None:
        return None
    value = given.get("value") if isinstance(given, dict) else None
    if not isinstance(given, dict) or given.get("type") not in kinds:
        raise _invalid(f"{param}.{name}", f"expected an object of type {' or '.join(kinds)}")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _invalid(f"{param}.{name}.value", "expected a non-negative integer")
    return value


def _clear_tool_uses(edit: dict[str, Any], param: str) -> ClearToolUses:
    trigger = edit.get("trigger")
    by_uses = isinstance(trigger, dict) and trigger.get("type") == "tool_uses"
    value = _count(edit, "trigger", ("input_tokens", "tool_uses"), param)
    excluded = edit.get("exclude_tools") or []
    if not isinstance(excluded, list) or not all(isinstance(t, str) for t in excluded):
        raise _invalid(f"{param}.exclude_tools", "expected a list of tool names")
    keep = _count(edit, "keep", ("tool_uses",), param)
    inputs = edit.get("clear_tool_inputs") or False
    if isinstance(inputs, list) and all(isinstance(t, str) for t in inputs):
        inputs = frozenset(inputs)
    elif not isinstance(inputs, bool):
        raise _invalid(f"{param}.clear_tool_inputs", "expected a boolean or a list of tool names")
    return ClearToolUses(
        trigger_tokens=None if by_uses else (100_000 if value is None else value),
        trigger_tool_uses=value if by_uses else None,
        keep=3 if keep is None else keep,
        clear_at_least=_count(edit, "clear_at_least", ("input_tokens",), param) or 0,
        exclude_tools=frozenset(excluded),
        clear_inputs=inputs,
    )


def _thinking_kept(edit: dict[str, Any], param: str) -> int | None:
    """How many of the newest assistant turns keep their thinking (1 by default); None for
    ``all``."""
    keep = edit.get("keep")
    if keep is None:
        return 1
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return None
    return _count(edit, "keep", ("thinking_turns",), param)


def asked_compaction(body: dict[str, Any]) -> AskedCompaction | None:
    """The edits of a body's ``context_management``; None when it has none. BadRequest, in
    the API's words, for an edit it would refuse."""
    management = body.get("context_management")
    if management is None:
        return None
    edits = management.get("edits") if isinstance(management, dict) else None
    if not isinstance(edits, list):
        raise _invalid("context_management.edits", "expected a list of edits")
    asked = AskedCompaction()
    for index, edit in enumerate(edits):
        param = f"context_management.edits.{index}"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not isinstance(edit, dict) or kind not in EDITS:
            raise _invalid(f"{param}.type", f"expected one of {', '.join(EDITS)}")
        if kind == CLEAR_TOOL_USES:
            asked = dataclasses.replace(asked, clear_tool_uses=_clear_tool_uses(edit, param))
        elif kind == CLEAR_THINKING:
            kept = _thinking_kept(edit, param)
            asked = dataclasses.replace(asked, keep_thinking_turns=kept)
        elif kind == COMPACT:
            trigger = _count(edit, "trigger", ("input_tokens",), param)
            pause = edit.get("pause_after_compaction", False)
            instructions = edit.get("instructions")
            if not isinstance(pause, bool):
                raise _invalid(f"{param}.pause_after_compaction", "expected a boolean")
            if instructions is not None and not isinstance(instructions, str):
                raise _invalid(f"{param}.instructions", "expected a string")
            threshold = DEFAULT_COMPACT_TRIGGER if trigger is None else trigger
            asked = dataclasses.replace(
                asked, threshold=threshold, pause=pause, instructions=instructions
            )
    return asked


def without_context_management(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` for an upstream that has no ``context_management``."""
    return {key: value for key, value in body.items() if key != "context_management"}


def compaction_block(made: MadeCompaction) -> dict[str, Any]:
    return {"type": BLOCK_TYPE, "content": made.summary, "encrypted_content": made.token}


def _is_proxy_block(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == BLOCK_TYPE
        and is_sealed(block.get("encrypted_content"))
    )


def opened_blocks(body: Any, opened: Callable[[str], str]) -> dict[str, Any] | None:
    """``body`` with the history up to the last compaction block the proxy made replaced by
    ``opened(token)`` (the checkpoint's text) as a user turn, what followed the block kept;
    None when it holds none. BadRequest naming the block for one ``opened`` refuses."""
    turns = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(turns, list):
        return None
    found = None
    for index, turn in enumerate(turns):
        content = turn.get("content") if isinstance(turn, dict) else None
        for place, block in enumerate(content if isinstance(content, list) else []):
            if _is_proxy_block(block):
                found = (index, place, block)
    if found is None:
        return None
    index, place, block = found
    try:
        text = opened(block["encrypted_content"])
    except ForgedCheckpoint as exc:
        param = f"messages.{index}.content.{place}.encrypted_content"
        raise BadRequest(
            f"{param}: the compaction block {exc}.", param=param, code="invalid_request_error"
        ) from exc
    rest = turns[index]["content"][place + 1 :]
    kept = [{**turns[index], "content": rest}] if rest else []
    checkpoint = {"role": "user", "content": [{"type": "text", "text": text}]}
    return {**body, "messages": [checkpoint, *kept, *turns[index + 1 :]]}


def _usage_iterations(
    made: MadeCompaction, usage: dict[str, Any], output_tokens: Any
) -> list[dict[str, Any]]:
    """``usage.iterations``: the compaction's, then the model's answer's."""

    def count(name: str, source: dict[str, Any] = usage) -> int:
        value = source.get(name)
        return value if isinstance(value, int) else 0

    answer = {
        "type": "message",
        "input_tokens": count("input_tokens"),
        "output_tokens": output_tokens if isinstance(output_tokens, int) else 0,
        "cache_creation_input_tokens": count("cache_creation_input_tokens"),
        "cache_read_input_tokens": count("cache_read_input_tokens"),
    }
    compaction = {
        "type": "compaction",
        "input_tokens": made.input_tokens,
        "output_tokens": made.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    return [compaction, answer]


THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
CHARS_PER_TOKEN = 4  # what a cleared block held, in tokens: an estimate is enough here


def edited_turns(
    body: dict[str, Any], asked: AskedCompaction, cleared: ClearedToolUses | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``body`` (as it is forwarded) with the clearing ``asked`` that works on whole turns:
    the inputs of the calls whose results went (``clear_tool_inputs``), and the thinking of
    assistant turns older than the newest ``keep_thinking_turns``; and ``applied_edits``."""
    turns = body.get("messages")
    if not isinstance(turns, list):
        return body, _applied(cleared, 0, 0, 0)
    clear = asked.clear_tool_uses
    inputs = clear.clear_inputs if clear is not None and cleared is not None else False
    ids = set(cleared.call_ids) if cleared is not None else set()
    with_thinking = [
        index
        for index, turn in enumerate(turns)
        if isinstance(turn, dict)
        and turn.get("role") == "assistant"
        and any(_type(b) in THINKING_BLOCKS for b in _content(turn))
    ]
    keep = asked.keep_thinking_turns
    # The newest ``keep`` keep theirs (``[:-0 or None]`` is every turn: keep 0 clears all).
    old_thinking = set(with_thinking[: -keep or None]) if keep is not None else set()
    input_chars = thinking_chars = 0
    edited: list[Any] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") != "assistant":
            edited.append(turn)
            continue
        blocks: list[Any] = []
        for block in _content(turn):
            kind = _type(block)
            if index in old_thinking and kind in THINKING_BLOCKS:
                thinking_chars += len(orjson.dumps(block))
                continue
            if kind == "tool_use" and block.get("id") in ids and _inputs_cleared(inputs, block):
                input_chars += len(orjson.dumps(block.get("input")))
                block = {**block, "input": {}}
            blocks.append(block)
        edited.append({**turn, "content": blocks} if blocks else turn)
    thinking_turns = len(old_thinking)
    applied = _applied(cleared, input_chars, thinking_turns, thinking_chars)
    return {**body, "messages": edited}, applied


def _content(turn: dict[str, Any]) -> list[Any]:
    content = turn.get("content")
    return content if isinstance(content, list) else []


def _type(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None


def _inputs_cleared(inputs: bool | frozenset[str], block: dict[str, Any]) -> bool:
    return inputs is True or (isinstance(inputs, frozenset) and block.get("name") in inputs)


def _applied(
    cleared: ClearedToolUses | None, input_chars: int, thinking_turns: int, thinking_chars: int
) -> list[dict[str, Any]]:
    applied = []
    if cleared is not None:
        applied.append(
            {
                "type": CLEAR_TOOL_USES,
                "cleared_tool_uses": cleared.tool_uses,
                "cleared_input_tokens": cleared.tokens + input_chars // CHARS_PER_TOKEN,
            }
        )
    if thinking_turns:
        applied.append(
            {
                "type": CLEAR_THINKING,
                "cleared_thinking_turns": thinking_turns,
                "cleared_input_tokens": thinking_chars // CHARS_PER_TOKEN,
            }
        )
    return applied


@frozen
class ManagedAnswer:
    """A Messages answer with what the proxy did for its ``context_management``: the
    compaction block first (``made``), ``applied_edits`` (when clearing was asked: None
    when not), and the compaction's ``usage.iterations``. In a stream the block's start,
    delta and stop come right after ``message_start``, every later block's ``index`` one up,
    and ``message_delta`` carries the rest."""

    made: MadeCompaction | None
    applied: tuple[dict[str, Any], ...] | None

    def whole(self, body: bytes) -> bytes:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(answer, dict) or not isinstance(answer.get("content"), list):
            return body
        if self.made is not None:
            given = answer.get("usage")
            usage: dict[str, Any] = given if isinstance(given, dict) else {}
            iterations = _usage_iterations(self.made, usage, usage.get("output_tokens"))
            answer["content"] = [compaction_block(self.made), *answer["content"]]
            answer["usage"] = {**usage, "iterations": iterations}
        if self.applied is not None:
            answer["context_management"] = {"applied_edits": list(self.applied)}
        return orjson.dumps(answer)

    def editor(self) -> EventEditor:
        return EventEditor(_ManagedStream(self).event)


@dataclass
class _ManagedStream:
    answer: ManagedAnswer
    usage: dict[str, Any] = field(default_factory=dict)  # message_start's

    def event(self, event: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind = event.get("type")
        made = self.answer.made
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self.usage = usage if isinstance(usage, dict) else {}
            return [event, *block_events(made, 0)] if made is not None else None
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            index = event.get("index")
            if made is None or not isinstance(index, int):
                return None
            return [{**event, "index": index + 1}]
        if kind == "message_delta":
            edited = dict(event)
            if self.answer.applied is not None:
                edited["context_management"] = {"applied_edits": list(self.answer.applied)}
            usage = event.get("usage")
            if made is not None and isinstance(usage, dict):
                iterations = _usage_iterations(made, self.usage, usage.get("output_tokens"))
                edited["usage"] = {**usage, "iterations": iterations}
            return [edited]
        return None


def block_events(made: MadeCompaction, index: int) -> list[dict[str, Any]]:
    """The compaction block as a stream gives it: start, one delta, stop."""
    delta = {"type": "compaction_delta", "content": made.summary, "encrypted_content": made.token}
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": BLOCK_TYPE, "content": None},
        },
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


def paused_answer(message_id: str, model: str, made: MadeCompaction, stream: bool) -> bytes:
    """The answer of a request that asked to pause after its compaction: the block alone,
    stopped for ``compaction``."""
    iterations = _usage_iterations(made, {}, 0)[:1]
    usage = {"input_tokens": 0, "output_tokens": 0, "iterations": iterations}
    message = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [compaction_block(made)],
        "stop_reason": PAUSED,
        "stop_sequence": None,
        "usage": usage,
    }
    if not stream:
        return orjson.dumps(message)
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "iterations": None},
    }
    events = [
        {"type": "message_start", "message": started},
        *block_events(made, 0),
        {
            "type": "message_delta",
            "delta": {"stop_reason": PAUSED, "stop_sequence": None},
            "usage": usage,
        },
        {"type": "message_stop"},
    ]
    return b"".join(sse_event(event) for event in events)
