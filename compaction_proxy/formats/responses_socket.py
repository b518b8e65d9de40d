"""Responses over a WebSocket, as requests over HTTP (pure).

OpenAI serves the Responses API over a WebSocket as well (``GET /v1/responses`` upgraded):
each turn is a ``response.create`` frame, the body of a ``POST /v1/responses`` with a
``type``, answered by the events a streamed answer has, one frame each. Two things a socket
has that HTTP has not, and how a frame becomes a request the proxy can compact:

- ``previous_response_id`` naming the connection's last response. The provider keeps that
  response's input and output for the connection, even with ``store: false``, and reads them
  before the frame's own input: a client sends only what is new (Codex does, every turn).
  ``http_body`` does the same, so the request is the whole history, as the client would have
  sent it over HTTP. An id the connection has not answered goes on as sent: the provider's
  to find, or to refuse, as it would be directly. The history is written once: a request
  continuing the last response writes its new items after the JSON of those it shares
  (``http_request``), not the whole body again each turn.
- ``generate: false``: a prompt sent ahead to warm the provider's cache, answered without a
  model's turn (Codex's prewarm). ``answered_here`` answers it, empty, and it becomes
  the connection's last response like any other, so the next frame may continue from it.

An answer that is not a stream of events becomes one ``error`` event (``error_event``), in the
shape OpenAI sends on a socket: ``{"type": "error", "status", "error", "headers"}``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from compaction_proxy.formats.wire import FrameRefused, SocketRequest, SocketResponse
from compaction_proxy.parsing import jsonio

CREATE = "response.create"
# Events that end an answer with a response a later frame may continue from, and all that end
# one.
_CONTINUABLE = frozenset({"response.completed", "response.incomplete"})
_ENDING = _CONTINUABLE | {"response.failed", "error"}
# What the data of an event that ends an answer holds, as JSON writes its type (or an escape,
# which could spell it otherwise).
_ENDING_MARKS = (*(b'"%s"' % kind.encode() for kind in _ENDING), b"\\u")
# Stands for the input in a body written around it: no request holds this string.
_INPUT_HERE = "\x00input-" + uuid.uuid4().hex
# The answer's headers an error event carries (what a client reads of a refusal).
_ERROR_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")


def _items(value: Any) -> list[Any] | None:
    """An ``input`` as a list of items; None when it is neither text nor a list (the
    endpoint's to refuse)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else None


def _items_json(items: list[Any]) -> bytes:
    """``items`` as JSON, comma-separated, without the brackets."""
    return b",".join(jsonio.dumps(item) for item in items)


def _joined(*parts: bytes) -> bytes:
    return b",".join(part for part in parts if part)


def _with_input(sent: dict[str, Any], input_json: bytes) -> bytes:
    """``sent`` as JSON, its input written from ``input_json`` (pure)."""
    around = jsonio.dumps({**sent, "input": _INPUT_HERE})
    return around.replace(jsonio.dumps(_INPUT_HERE), b"[" + input_json + b"]", 1)


def _continues(body: dict[str, Any], last: SocketResponse | None) -> list[Any] | None:
    """The new items of a body continuing ``last`` (it names it, with an input of items or
    text); None for any other body."""
    if last is None or body.get("previous_response_id") != last.response_id:
        return None
    return _items(body.get("input"))


def http_body(body: dict[str, Any], last: SocketResponse | None) -> dict[str, Any]:
    """What ``body`` asks for, as a streamed ``POST``: continuing ``last``, its input and
    output before the body's own input, when it names ``last`` (pure)."""
    return _expanded(body, last, _continues(body, last))


def _expanded(
    body: dict[str, Any], last: SocketResponse | None, new: list[Any] | None
) -> dict[str, Any]:
    """``http_body`` given ``new``, the items of a body continuing ``last`` (``_continues``)."""
    sent = {**body, "stream": True}
    if last is not None and new is not None:
        del sent["previous_response_id"]
        sent["input"] = [*last.input, *last.output, *new]
    return sent


def _type_of(event: dict[str, Any]) -> str | None:
    """An event's ``type``, when it is a string (an upstream may write anything there)."""
    kind = event.get("type")
    return kind if isinstance(kind, str) else None


def _prewarm_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer to a prewarm: a response created and completed with no output."""
    response: dict[str, Any] = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": body.get("model"),
        "output": [],
        "usage": None,
    }
    usage = {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    done = {**response, "status": "completed", "usage": usage}
    return [
        {"type": "response.created", "sequence_number": 0, "response": response},
        {"type": "response.completed", "sequence_number": 1, "response": done},
    ]


class ResponsesSocket:
    """The Responses API's ``SocketDialect``."""

    def request_body(self, frame: Any) -> dict[str, Any]:
        if not isinstance(frame, dict):
            raise FrameRefused("Invalid event: expected a JSON object.")
        kind = frame.get("type")
        if kind != CREATE:
            named = repr(kind[:60]) if isinstance(kind, str) else f"a {type(kind).__name__}"
            raise FrameRefused(f"Unsupported event type {named}: this server takes {CREATE!r}.")
        return {key: value for key, value in frame.items() if key != "type"}

    def http_request(self, body: dict[str, Any], last: SocketResponse | None) -> SocketRequest:
        new = _continues(body, last)
        sent = _expanded(body, last, new)
        if last is None or new is None:
            return SocketRequest(sent, jsonio.dumps(sent))
        shared = last.input_json if last.input_json is not None else _items_json(last.input)
        input_json = _joined(shared, _items_json(last.output), _items_json(new))
        return SocketRequest(sent, _with_input(sent, input_json), input_json)

    def answered_here(self, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        return _prewarm_events(body) if body.get("generate") is False else None

    def may_end(self, data: bytes) -> bool:
        return any(mark in data for mark in _ENDING_MARKS)

    def ends(self, event: dict[str, Any]) -> bool:
        return _type_of(event) in _ENDING

    def continued_by(self, event: dict[str, Any], sent: SocketRequest) -> SocketResponse | None:
        if _type_of(event) not in _CONTINUABLE:
            return None
        response = event.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("id"), str):
            return None
        output = response.get("output")
        items = _items(sent.body.get("input"))
        if items is None or not isinstance(output, list):
            return None
        return SocketResponse(response["id"], items, output, sent.input_json)

    def error_event(self, status: int, body: Any, headers: Mapping[str, str]) -> dict[str, Any]:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            text = body if isinstance(body, str) and body else f"The request failed ({status})."
            error = {"type": "api_error", "code": None, "message": text, "param": None}
        kept = {name: headers[name] for name in _ERROR_HEADERS if name in headers}
        return {"type": "error", "status": status, "error": error, "headers": kept}


RESPONSES_SOCKET = ResponsesSocket()
