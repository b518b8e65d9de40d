"""Session-log events, built from plain data (pure).

Events are plain JSON-able dicts with a ``type`` and a ``ts`` (seconds since the epoch).
Message content is kept only when ``log_content`` is on, and only for messages of at most
``content_limit`` characters of text; hashes, roles, positions and digests always.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.text import text_size
from compaction_proxy.frozen import frozen

Event = dict[str, Any]

CONTEXT_POSITION = -1  # MessageEvent position of a logged head-and-tools context

# The most characters of text (``text_size``) a request's message holds per byte of the body
# it came in. A chat body's messages are its own JSON, where every character of a key or a
# string takes a byte or more. A translated message (Responses, Messages) adds keys of its own,
# fewer characters than the syntax of the items it stands for; a number written again takes at
# most 5/3 of its bytes (``1E2`` as ``100.0``); an item the proxy does not know is carried as
# its JSON and named by its type, which so counts twice. Twice the body's bytes bound them all
# (its own fields, ``model`` at least, outweigh a wrapper's keys); a property test checks every
# wire format against it (``tests/unit/test_log_content_limit.py``).
TEXT_PER_BODY_BYTE = 2


@frozen
class MessageEvent:
    """A body message to log at chain position ``position`` with chain hash ``hash``.

    Logged when its chain hash is new to the conversation; with ``by_content``, only when its
    content (``content_key``) is new as well, so a rewritten body adds only contents the log
    lacks. A new hash marks both keys seen, logged or left out as a duplicate by content.
    Position ``CONTEXT_POSITION`` marks a request context (head and tools), deduplicated the
    same way but never the logged tip."""

    position: int
    hash: str
    event: Event
    content_key: str = ""
    by_content: bool = False


def body_tip(messages: Sequence[MessageEvent]) -> tuple[int, str] | None:
    """Position and chain hash of the last body message among ``messages`` (contexts skipped)."""
    for message in reversed(messages):
        if message.position >= 0:
            return message.position, message.hash
    return None


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
    root: str,
    start: int,
    *,
    log_content: bool,
    now: float,
    digests: Sequence[str] | None = None,
    by_content: bool = False,
    content_limit: int | None = None,
    body_bytes: int = 0,
) -> list[MessageEvent]:
    """``message`` events for body positions ``start..``; each names its chain hash and the
    one before it (``prev``), so any request's body can be read back from the log, and the
    digest of its content when ``digests`` are given.

    ``by_content``: deduplicate by content instead of by chain hash. A request that rewrote an
    early message shares no chain hash with the log, and would log its whole body again every
    turn; logged by content, it adds only what is new, and its ``request`` event carries the
    body's digests so the body can still be read back.

    ``content_limit``: a message with more text than this is logged without its content. A
    pasted 30 MB file would otherwise be copied into the store on every new conversation that
    carries it, and on Redis hold the server (every replica's requests) while it is written.
    ``body_bytes``: the request body's size, when known: a body too small for any of its
    messages to pass the limit (``TEXT_PER_BODY_BYTE``) has none measured."""
    if content_limit is not None and 0 < body_bytes * TEXT_PER_BODY_BYTE <= content_limit:
        content_limit = None
    events: list[MessageEvent] = []
    for position in range(start, len(body)):
        message = body[position]
        event: Event = {
            "type": "message",
            "ts": now,
            "position": position,
            "hash": chain[position],
            "prev": chain[position - 1] if position else root,
            "role": message.get("role"),
        }
        if digests is not None:
            event["digest"] = digests[position]
        if log_content and (content_limit is None or text_size(message) <= content_limit):
            event["message"] = message
        content_key = f"d:{digests[position]}" if digests is not None else ""
        events.append(MessageEvent(position, chain[position], event, content_key, by_content))
    return events


def context_event(
    head: Sequence[Message], tools: Any, digest: str, *, log_content: bool, now: float
) -> MessageEvent:
    """The request's head and tools, logged once per distinct value (deduplicated by digest)."""
    event: Event = {"type": "context", "ts": now, "digest": digest}
    if log_content:
        event["head"] = list(head)
        event["tools"] = tools
    return MessageEvent(CONTEXT_POSITION, f"context:{digest}", event)


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
    tip: str | None = None,
    context: str | None = None,
    digests: Sequence[str] | None = None,
    client_tokens: int | None = None,
    api: str = "chat",
) -> Event:
    """What was forwarded: ``estimated_tokens`` of the surface sent, ``client_tokens`` of the
    client's own messages (the same when nothing was replaced); ``api``, the API it came in,
    is logged when it is not chat (a request logged without it was chat)."""
    event: Event = {
        "type": "request",
        "ts": now,
        "model": model,
        "route": route,
        "tip": tip,
        "context": context,
        "generation": generation,
        "body_messages": body_length,
        "surface_messages": surface_length,
        "estimated_tokens": estimated_tokens,
        "client_tokens": estimated_tokens if client_tokens is None else client_tokens,
        "anchored": anchored,
        "status": status,
    }
    if digests is not None:
        event["digests"] = list(digests)
    if api != "chat":
        event["api"] = api
    return event


def overflow_event(*, now: float, limit: int | None, retried: bool) -> Event:
    """The upstream answered a context overflow (``limit``: the window it stated, if any)."""
    return {"type": "overflow", "ts": now, "limit": limit, "retried": retried}


def usage_event(
    *, now: float, usage: dict[str, Any], status: int, cache_read: int = 0, cache_written: int = 0
) -> Event:
    """The usage the upstream reported for a request; with the prompt tokens its cache read
    and wrote, where it reported any (absent: none)."""
    event: Event = {
        "type": "usage",
        "ts": now,
        "status": status,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "total_tokens": usage.get("total_tokens"),
    }
    if cache_read:
        event["cache_read_tokens"] = cache_read
    if cache_written:
        event["cache_written_tokens"] = cache_written
    return event
