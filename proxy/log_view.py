"""Reading a conversation's latest request back from its session log (pure).

Message events carry their chain hash and the one before it; request events name the chain tip
and the context (head and tools) they were sent with. Walking back from the latest request's tip
rebuilds exactly the body that request sent, forks and edits notwithstanding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from proxy.conversation import Message
from proxy.store.base import Event


@dataclass(frozen=True)
class LoggedRequest:
    model: str
    head: list[Message]
    tools: Any
    body: list[Message]
    has_content: bool  # False when the log kept hashes only (log_content off)


def latest_request(events: Iterable[Event]) -> LoggedRequest | None:
    """The latest logged request with its body, or None when there is none to rebuild."""
    messages: dict[str, Event] = {}
    contexts: dict[str, Event] = {}
    latest: Event | None = None
    for event in events:
        kind = event.get("type")
        if kind == "message":
            messages.setdefault(str(event["hash"]), event)
        elif kind == "context":
            contexts[str(event["digest"])] = event
        elif kind == "request":
            latest = event
    if latest is None:
        return None
    chain: list[Event] = []
    cursor = latest.get("tip")
    while cursor is not None and cursor in messages:
        event = messages[cursor]
        chain.append(event)
        cursor = event.get("prev") if event.get("position", 0) > 0 else None
    chain.reverse()
    if len(chain) != latest.get("body_messages") or [e["position"] for e in chain] != list(
        range(len(chain))
    ):
        return None
    context = contexts.get(str(latest.get("context")), {})
    has_content = all("message" in e for e in chain) and "head" in context
    return LoggedRequest(
        model=str(latest.get("model", "")),
        head=list(context.get("head") or []),
        tools=context.get("tools"),
        body=[e.get("message") or {"role": e.get("role")} for e in chain],
        has_content=has_content,
    )
