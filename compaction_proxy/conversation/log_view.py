"""Reading a conversation's latest request back from its session log (pure).

Message events carry their chain hash and the one before it; request events name the chain tip
and the context (head and tools) they were sent with. Walking back from the latest request's tip
rebuilds exactly the body that request sent, forks and edits notwithstanding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from compaction_proxy.conversation.log_events import Event
from compaction_proxy.conversation.messages import Message
from compaction_proxy.frozen import frozen


@frozen
class LoggedRequest:
    model: str
    head: list[Message]
    tools: Any
    body: list[Message]
    has_content: bool  # False when the log kept hashes only (log_content off)
    api: str = "chat"  # the API the request came in: its summary calls are made in it


def latest_request(events: Iterable[Event]) -> LoggedRequest | None:
    """The latest logged request with its body, or None when there is none to rebuild.

    Walks back from the request's tip along ``prev`` links. A request that was logged by
    content (it rewrote earlier messages) carries its body's digests: reaching its tip, the
    rest of the body is read by digest instead."""
    messages: dict[str, Event] = {}
    by_digest: dict[str, Event] = {}
    by_content: dict[str, Event] = {}  # tip -> request event that carries the body's digests
    contexts: dict[str, Event] = {}
    latest: Event | None = None
    for event in events:
        kind = event.get("type")
        if kind == "message":
            messages.setdefault(str(event["hash"]), event)
            if "digest" in event:
                by_digest.setdefault(str(event["digest"]), event)
        elif kind == "context":
            contexts[str(event["digest"])] = event
        elif kind == "request":
            latest = event
            if event.get("digests") is not None:
                by_content[str(event.get("tip"))] = event
    if latest is None:
        return None
    walked: list[Event] = []  # from the tip back
    prefix: list[Event] = []  # read by digest, in body order
    cursor = latest.get("tip")
    while cursor is not None:
        spliced = by_content.get(str(cursor))
        if spliced is not None:
            found = [by_digest.get(str(d)) for d in spliced["digests"]]
            prefix = [e for e in found if e is not None]
            if len(prefix) != len(found):
                return None
            break
        step = messages.get(str(cursor))
        if step is None:
            break
        walked.append(step)
        cursor = step.get("prev") if step.get("position", 0) > 0 else None
    walked.reverse()
    if not prefix and [e["position"] for e in walked] != list(range(len(walked))):
        return None
    chain = [*prefix, *walked]
    if len(chain) != latest.get("body_messages"):
        return None
    context = contexts.get(str(latest.get("context")), {})
    has_content = all("message" in e for e in chain) and "head" in context
    return LoggedRequest(
        model=str(latest.get("model", "")),
        head=list(context.get("head") or []),
        tools=context.get("tools"),
        body=[e.get("message") or {"role": e.get("role")} for e in chain],
        has_content=has_content,
        api=str(latest.get("api", "chat")),
    )
