"""Session-log events, built from plain data (pure).

Events are plain JSON-able dicts with a ``type`` and a ``ts`` (seconds since the epoch).
Message content is kept only when ``log_content`` is on; hashes, roles and positions always.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.conversation import Message
from proxy.store.base import Event, MessageEvent


def first_unlogged(chain: Sequence[str], logged_tip: tuple[int, str] | None) -> int:
    """Body position from which messages may be new to the log.

    When the last logged tip is a prefix of this request, only what follows it can be new;
    otherwise (a fork, an edit, another replica's conversation) everything is offered and the
    store's per-hash deduplication decides.
    """
    if logged_tip is None:
        return 0
    position, tip_hash = logged_tip
    if position < len(chain) and chain[position] == tip_hash:
        return position + 1
    return 0


def message_events(
    body: Sequence[Message],
    chain: Sequence[str],
    start: int,
    *,
    log_content: bool,
    now: float,
    tokens: Sequence[int] | None = None,
) -> list[MessageEvent]:
    events: list[MessageEvent] = []
    for position in range(start, len(body)):
        message = body[position]
        event: Event = {
            "type": "message",
            "ts": now,
            "position": position,
            "hash": chain[position],
            "role": message.get("role"),
        }
        if tokens is not None:
            event["tokens"] = tokens[position]
        if log_content:
            event["message"] = message
        events.append(MessageEvent(position, chain[position], event))
    return events


def request_event(
    *,
    now: float,
    model: str,
    route: str,
    generation: int,
    body_length: int,
    surface_length: int,
    estimated_tokens: int | None,
    anchored: bool,
    status: str,
) -> Event:
    return {
        "type": "request",
        "ts": now,
        "model": model,
        "route": route,
        "generation": generation,
        "body_messages": body_length,
        "surface_messages": surface_length,
        "estimated_tokens": estimated_tokens,
        "anchored": anchored,
        "status": status,
    }


def usage_event(*, now: float, usage: dict[str, Any], status: int) -> Event:
    return {
        "type": "usage",
        "ts": now,
        "status": status,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "total_tokens": usage.get("total_tokens"),
    }
