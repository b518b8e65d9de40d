"""Edits the proxy makes to an upstream's successful answer (pure): only for a request that
asked for something the upstream lacks and the proxy served (``service.native_compaction``).
Every other answer reaches the client byte for byte; these never touch the common path.

An edit works on a whole JSON answer (``whole``) and on a stream of server-sent events
(``EventEditor``: events are cut at their blank line, those the edit leaves alone pass as
they came, byte for byte, the others are written again as ``event:``/``data:`` lines).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

import orjson

# One event as parsed, in: the events to send in its place, out.
EventEdit = Callable[[dict[str, Any]], list[dict[str, Any]] | None]  # None: leave it as it is


class AnswerEdit(Protocol):
    def whole(self, body: bytes) -> bytes:
        """A whole JSON answer, edited."""
        ...

    def editor(self) -> EventEditor:
        """A fresh editor for one streamed answer."""
        ...


# A line's end, as the SSE standard has them (CRLF, LF, or CR alone), twice: a blank line,
# which ends an event.
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


class EventStream:
    """A stream of server-sent events fed in chunks: each chunk's whole events, cut after
    their blank line, each keeping its line ends (every byte passes, in order)."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes."""
        data = self._held + chunk
        # A CR last may be the first half of a CRLF: held until the next byte says.
        searched = data[:-1] if data.endswith(b"\r") else data
        cut = 0
        for blank in _BLANK_LINE.finditer(searched):
            cut = blank.end()
        self._held = data[cut:]
        return _events(data[:cut])

    def close(self) -> bytes:
        """What is left: an event the stream did not end with a blank line, or nothing."""
        rest, self._held = self._held, b""
        return rest


def event_fields(event: bytes) -> tuple[bytes | None, bytes | None]:
    """An event's ``event:`` name and its one ``data:`` line's payload (None for either it
    lacks; a payload in several ``data:`` lines is None too)."""
    name, data = None, []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, data[0] if len(data) == 1 else None


def event_object(data: bytes) -> dict[str, Any] | None:
    """An event's data as a JSON object; None when it is none."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


class EventEditor:
    """Applies ``edit`` to each ``data:`` event of a stream fed in chunks."""

    def __init__(self, edit: EventEdit) -> None:
        self._edit = edit
        self._stream = EventStream()

    def feed(self, chunk: bytes) -> bytes:
        """What to send of ``chunk`` now: the events it completes, edited."""
        return b"".join(self._one(event) for event in self._stream.feed(chunk))

    def close(self) -> bytes:
        """What is left: an event the stream did not end with a blank line, edited."""
        rest = self._stream.close()
        return b"".join(self._one(event) for event in _events(rest)) if rest.strip() else rest

    def _one(self, event: bytes) -> bytes:
        _, data = event_fields(event)
        parsed = None if data is None else event_object(data)
        if parsed is None:
            return event
        replaced = self._edit(parsed)
        if replaced is None:
            return event
        return b"".join(sse_event(e) for e in replaced)


def _events(block: bytes) -> list[bytes]:
    """``block`` cut after each blank line, each piece keeping its line ends."""
    pieces: list[bytes] = []
    start = 0
    for blank in _BLANK_LINE.finditer(block):
        pieces.append(block[start : blank.end()])
        start = blank.end()
    if start < len(block):
        pieces.append(block[start:])
    return pieces


def sse_event(event: dict[str, Any]) -> bytes:
    """One event as ``event:`` and ``data:`` lines, named by its ``type``."""
    name = str(event.get("type", "message")).encode()
    return b"event: %s\ndata: %s\n\n" % (name, orjson.dumps(event))
