"""A conversation's life read from its log: one point per request, and what happened between.

Pure: log events in (as the store returns them, oldest first), plain data out. The inspector
page draws this; it computes nothing of its own.

Invariants:

* One point per ``request`` event, in log order; a request event that answers an overflow
  (``status: recovered``) is a point of its own, marked as the retry it is.
* A point's ``prompt_tokens`` is the upstream's usage for it when the next ``usage`` event
  follows it before any other request; otherwise None.
* Every ``compaction/start`` is paired with the ``compaction/end`` of the same owner; a start
  with no end (a crash mid-compaction) is reported with outcome ``unfinished``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

Event = Mapping[str, Any]


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def request_points(events: Iterable[Event]) -> list[dict[str, Any]]:
    """One point per request: when, tokens the client sent, tokens forwarded, what was done,
    the generation, and the upstream's prompt tokens when it reported them, with those its
    prompt cache read and wrote."""
    points: list[dict[str, Any]] = []
    waiting: dict[str, Any] | None = None
    for event in events:
        kind = event.get("type")
        if kind == "request":
            forwarded = _number(event.get("estimated_tokens"))
            sent = _number(event.get("client_tokens"))
            waiting = {
                "index": len(points),
                "ts": event.get("ts"),
                "sent_tokens": sent if sent is not None else forwarded,
                "forwarded_tokens": forwarded,
                "status": event.get("status"),
                "generation": _number(event.get("generation")),
                "messages": _number(event.get("body_messages")),
                "prompt_tokens": None,
                "cache_read_tokens": None,
                "cache_written_tokens": None,
                "http_status": None,
            }
            points.append(waiting)
        elif kind == "usage" and waiting is not None:
            waiting["prompt_tokens"] = _number(event.get("prompt_tokens"))
            # Left out of the event when the upstream's cache did nothing with the prompt.
            waiting["cache_read_tokens"] = _number(event.get("cache_read_tokens", 0))
            waiting["cache_written_tokens"] = _number(event.get("cache_written_tokens", 0))
            waiting["http_status"] = _number(event.get("status"))
            waiting = None
    return points


def _between_requests(events: Iterable[Event]) -> Iterator[tuple[int, Event]]:
    """Every event but the requests, with how many requests came before it."""
    seen = 0
    for event in events:
        if event.get("type") == "request":
            seen += 1
        else:
            yield seen, event


def compactions(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Every compaction attempt: when it started and ended, its trigger, mechanism and
    outcome, and the request it happened before (the index of the next request point)."""
    attempts: list[dict[str, Any]] = []
    open_by_owner: dict[Any, dict[str, Any]] = {}
    for requests_seen, event in _between_requests(events):
        kind = event.get("type")
        if kind == "compaction/start":
            started: dict[str, Any] = {
                "started": event.get("ts"),
                "ended": None,
                "trigger": event.get("trigger"),
                "mechanism": event.get("kind"),
                "outcome": "unfinished",
                "detail": None,
                "before_request": requests_seen,
            }
            attempts.append(started)
            open_by_owner[event.get("owner")] = started
        elif kind == "compaction/end":
            ended = open_by_owner.pop(event.get("owner"), None)
            if ended is not None:
                ended["ended"] = event.get("ts")
                ended["outcome"] = event.get("outcome") or event.get("error") or "ended"
                ended["detail"] = event.get("detail")
    return attempts


def overflows(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Every context overflow the upstream answered: when, the limit it stated, whether the
    request was retried, and the request point it answered."""
    found: list[dict[str, Any]] = []
    for requests_seen, event in _between_requests(events):
        if event.get("type") == "overflow":
            found.append(
                {
                    "ts": event.get("ts"),
                    "limit": _number(event.get("limit")),
                    "retried": bool(event.get("retried")),
                    "request": max(0, requests_seen - 1),
                }
            )
    return found


def timeline(events: Iterable[Event]) -> dict[str, Any]:
    every = list(events)
    return {
        "requests": request_points(every),
        "compactions": compactions(every),
        "overflows": overflows(every),
    }
