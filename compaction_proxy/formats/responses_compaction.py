"""The Responses API's compaction, in its own shapes (pure): the ``compaction`` item, the
``compaction_trigger`` Codex ends a request with, ``/v1/responses/compact``'s answer, the
``context_management`` compaction option, and the answer with the item first.

The item carries the proxy's sealed token (``formats.sealed_checkpoints``) as its
``encrypted_content``; sent back, it becomes the checkpoint as a user message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.formats.answer_edits import EventEditor
from compaction_proxy.formats.asked_compaction import AskedCompaction
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.sealed_checkpoints import ForgedCheckpoint, MadeCompaction, is_sealed
from compaction_proxy.frozen import frozen

TRIGGER_TYPE = "compaction_trigger"
ITEM_TYPE = "compaction"
CREATED_BY = "compaction-proxy"
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# What a compact body keeps when read as a Responses request: the rest (reasoning options,
# ``store``, streaming) means nothing to a summary.
KEPT_FIELDS = ("model", "instructions", "tools")


def compaction_item(token: str) -> dict[str, Any]:
    """The ``compaction`` item carrying ``token``; its id is a digest of the token."""
    ident = "cmp_" + hashlib.sha256(token.encode()).hexdigest()[:32]
    return {"id": ident, "type": ITEM_TYPE, "encrypted_content": token, "created_by": CREATED_BY}


def is_proxy_item(item: Any) -> bool:
    """Whether ``item`` is a ``compaction`` item the proxy made (verified or not)."""
    return (
        isinstance(item, dict)
        and item.get("type") == ITEM_TYPE
        and is_sealed(item.get("encrypted_content"))
    )


def opened_items(body: Any, opened: Callable[[str], str]) -> dict[str, Any] | None:
    """``body`` with each of the proxy's items replaced by ``opened(token)`` (the checkpoint's
    text) as a user message; None when it holds none. BadRequest naming the item for one
    ``opened`` refuses (ForgedCheckpoint)."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list) or not any(is_proxy_item(item) for item in items):
        return None
    replaced: list[Any] = []
    for index, item in enumerate(items):
        if is_proxy_item(item):
            try:
                text = opened(item["encrypted_content"])
            except ForgedCheckpoint as exc:
                raise BadRequest(
                    f"Invalid 'input[{index}]': the compaction item {exc}.",
                    param=f"input[{index}].encrypted_content",
                    code="invalid_encrypted_content",
                ) from exc
            item = {"type": "message", "role": "user", "content": [input_text(text)]}
        replaced.append(item)
    return {**body, "input": replaced}


def input_text(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def asks_for_compaction(body: dict[str, Any]) -> bool:
    """Whether a Responses body ends with a ``compaction_trigger`` item (Codex's remote
    compaction: the answer must be exactly one ``compaction`` item)."""
    items = body.get("input")
    if not isinstance(items, list) or not items:
        return False
    last = items[-1]
    return isinstance(last, dict) and last.get("type") == TRIGGER_TYPE


def _is_compaction_option(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("type") == ITEM_TYPE


def asked_compaction(body: dict[str, Any]) -> AskedCompaction | None:
    """A body's ``context_management`` compaction and its ``compact_threshold`` (tokens);
    None when it asks for none."""
    entries = body.get("context_management")
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if _is_compaction_option(entry):
            threshold = entry.get("compact_threshold")
            valid = isinstance(threshold, int) and not isinstance(threshold, bool)
            return AskedCompaction(threshold if valid and threshold > 0 else None)
    return None


def without_compaction_option(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without its ``context_management`` compaction (the field left out when
    nothing else is in it), for an upstream that has no such option."""
    entries = body.get("context_management")
    kept = [e for e in entries if not _is_compaction_option(e)] if isinstance(entries, list) else []
    rest = {key: value for key, value in body.items() if key != "context_management"}
    return {**rest, "context_management": kept} if kept else rest


def compact_request_body(body: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/responses/compact`` body as a Responses request ending with a trigger;
    BadRequest for an ``input`` that is none."""
    given = body.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        items = list(given)
    else:
        raise BadRequest(
            "Invalid 'input': expected a string or an array of items.",
            param="input",
            code="invalid_type",
        )
    kept = {field: body[field] for field in KEPT_FIELDS if field in body}
    return {**kept, "input": [*items, {"type": TRIGGER_TYPE}], "store": False}


def user_message_items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """The user messages among ``items``, as ``/v1/responses/compact`` returns them ahead of
    its compaction item."""
    kept = []
    for item in items:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        if item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            content = [input_text(content)]
        kept.append({"type": "message", "role": "user", "content": content})
    return kept


def responses_usage(made: MadeCompaction) -> dict[str, Any]:
    """What the compaction took and gave, as the Responses API reports usage."""
    taken, given = made.input_tokens, made.output_tokens
    return {
        "input_tokens": taken,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": given,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": taken + given,
    }


def trigger_answer(
    response_id: str, model: str, created: int, made: MadeCompaction, stream: bool
) -> bytes:
    """The answer to a ``compaction_trigger``: a Response with one ``compaction`` output, as
    events when the request streams (created, the item added and done, completed)."""
    item = compaction_item(made.token)
    response = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": [item],
        "usage": responses_usage(made),
        "error": None,
        "incomplete_details": None,
    }
    if not stream:
        return orjson.dumps(response)
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps({**e, "sequence_number": n}))
        for n, e in enumerate(events)
    )


def compacted_answer(
    response_id: str, created: int, items: Sequence[Any], made: MadeCompaction
) -> bytes:
    """``/v1/responses/compact``'s answer: the input's user messages, then the item."""
    sent = [i for i in items if not (isinstance(i, dict) and i.get("type") == TRIGGER_TYPE)]
    answer = {
        "id": response_id,
        "object": "response.compaction",
        "created_at": created,
        "output": [*user_message_items(sent), compaction_item(made.token)],
        "usage": responses_usage(made),
    }
    return orjson.dumps(answer)


@frozen
class FirstOutputItem:
    """A Responses answer with ``item`` as its first output, the upstream's after it (a
    ``context_management`` compaction: the client drops what comes before the item, so the
    answer must follow it). In a stream the item is added and done right after
    ``response.created``; every later event's ``output_index`` moves up by one and its
    ``sequence_number`` by two, and the terminal response lists the item first."""

    item: dict[str, Any]

    def whole(self, body: bytes) -> bytes:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
            return body
        return orjson.dumps({**answer, "output": [self.item, *answer["output"]]})

    def editor(self) -> EventEditor:
        return EventEditor(_ItemFirst(self.item).event)


@dataclass
class _ItemFirst:
    """One stream's state for ``FirstOutputItem``."""

    item: dict[str, Any]
    sent: bool = field(default=False)

    def event(self, event: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind = event.get("type")
        if kind == "response.created" and not self.sent:
            self.sent = True
            number = event.get("sequence_number")
            added = {"type": "response.output_item.added", "output_index": 0, "item": self.item}
            done = {**added, "type": "response.output_item.done"}
            if isinstance(number, int):
                added["sequence_number"], done["sequence_number"] = number + 1, number + 2
            return [event, added, done]
        if not self.sent:
            return None
        moved = dict(event)
        if isinstance(moved.get("output_index"), int):
            moved["output_index"] += 1
        if isinstance(moved.get("sequence_number"), int):
            moved["sequence_number"] += 2
        response = moved.get("response")
        if kind in TERMINAL_EVENTS and isinstance(response, dict):
            output = response.get("output")
            if isinstance(output, list):
                moved["response"] = {**response, "output": [self.item, *output]}
        return [moved]
