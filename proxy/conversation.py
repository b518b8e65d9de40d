"""The conversation model: canonical messages, chain hashes, replacement records, the surface.

Everything here is pure: plain data in, plain data out, no I/O.

Invariants (DESIGN.md §3):

* ``chain[i]`` names the whole body prefix ``body[0..i]`` of one tenant, so two requests share
  ``chain[i]`` exactly when they share that prefix.
* A replacement record applies to a request only when the request shares the exact prefix the
  record was made from; a request never receives a replacement whose prefix it does not share.
* The head (leading ``system``/``developer`` messages) is never replaced and never hashed: it is
  always taken from the current request.
* A checkpoint never covers the last body message: the model always sees the newest turn as sent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

Message = dict[str, Any]

HEAD_ROLES = frozenset({"system", "developer"})
MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

_DIGEST_SIZE = 16
_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def canonical_message(message: Mapping[str, Any]) -> bytes:
    """The bytes that identify a message for hashing.

    Keeps only the semantic fields; null or empty ones and provider extras (``refusal``,
    ``annotations``, ...) are dropped, so a client that re-serializes an assistant message
    slightly differently still produces the same bytes.
    """
    canonical: dict[str, Any] = {"role": message.get("role")}
    for key in ("content", "name", "tool_call_id"):
        value = message.get(key)
        if _present(value):
            canonical[key] = value
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        canonical["tool_calls"] = [_canonical_call(call) for call in tool_calls]
    function_call = message.get("function_call")
    if isinstance(function_call, Mapping) and function_call:
        canonical["function_call"] = {
            "name": function_call.get("name"),
            "arguments": function_call.get("arguments"),
        }
    return orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)


def _canonical_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    return {
        "id": call.get("id"),
        "type": call.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": function.get("arguments")},
    }


def split_head(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """Split off the leading run of system/developer messages (the head) from the body."""
    cut = 0
    while cut < len(messages) and messages[cut].get("role") in HEAD_ROLES:
        cut += 1
    return list(messages[:cut]), list(messages[cut:])


def chain_root(tenant: str) -> str:
    """``c[-1]``: the hash every chain of this tenant starts from."""
    return _digest(b"tenant\x00", tenant.encode())


def message_digest(message: Mapping[str, Any]) -> str:
    """``H(canonical(message))``: names one message's content, wherever it stands."""
    return _digest(canonical_message(message))


def chain_hashes(
    root: str, body: Sequence[Message], digests: Sequence[str] | None = None
) -> list[str]:
    """``c[i] = H(c[i-1] || H(canonical(body[i])))`` for every body position.

    ``digests`` (from ``message_digest``) may be passed when already computed, so a request's
    messages are serialized and hashed once for the chain and the token meter together.
    """
    if digests is None:
        digests = [message_digest(message) for message in body]
    chain: list[str] = []
    previous = bytes.fromhex(root)
    for digest in digests:
        previous = hashlib.blake2b(
            previous + bytes.fromhex(digest), digest_size=_DIGEST_SIZE
        ).digest()
        chain.append(previous.hex())
    return chain


def is_valid_session_id(value: str) -> bool:
    return _SESSION_ID.fullmatch(value) is not None


def conversation_id(tenant: str, root: str, chain: Sequence[str], session_id: str | None) -> str:
    """Groups a conversation's log, lease, generation and metrics.

    From the ``X-Session-Id`` header when given (namespaced by tenant), else from the first body
    message. It does not decide which replacements apply; chain hashes do.
    """
    if session_id is not None:
        return "s" + _digest(b"session\x00", tenant.encode(), b"\x00", session_id.encode())
    return "c" + (chain[0] if chain else root)


@dataclass(frozen=True)
class Checkpoint:
    """Body positions ``start..end`` (inclusive) replaced by one framed summary message."""

    start: int
    end: int
    start_prev_hash: str
    end_hash: str
    message: Message
    tokens: int
    shadowed_tokens: int = 0
    kind: Literal["checkpoint"] = "checkpoint"

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"checkpoint span {self.start}..{self.end} is empty or negative")


@dataclass(frozen=True)
class Prune:
    """Content-only replacement of the tool result at body ``position``."""

    position: int
    hash: str
    content: Any
    chars_before: int = 0
    chars_after: int = 0
    kind: Literal["prune"] = "prune"


ReplacementRecord = Checkpoint | Prune


def record_to_dict(record: ReplacementRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def record_from_dict(data: Mapping[str, Any]) -> ReplacementRecord:
    fields = dict(data)
    kind = fields.get("kind")
    if kind == "checkpoint":
        return Checkpoint(**fields)
    if kind == "prune":
        return Prune(**fields)
    raise ValueError(f"unknown replacement record kind {kind!r}")


NodeKind = Literal["head", "body", "pruned", "checkpoint"]


@dataclass(frozen=True)
class SurfaceNode:
    """One forwarded message and the body positions it stands for (none for the head)."""

    message: Message
    kind: NodeKind
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True)
class Surface:
    nodes: tuple[SurfaceNode, ...]
    checkpoints: tuple[Checkpoint, ...] = ()
    prunes: tuple[Prune, ...] = ()

    @property
    def messages(self) -> list[Message]:
        return [node.message for node in self.nodes]

    @property
    def changed(self) -> bool:
        """True when the surface differs from the request's own messages."""
        return bool(self.checkpoints or self.prunes)


def derive_surface(
    head: Sequence[Message],
    body: Sequence[Message],
    chain: Sequence[str],
    root: str,
    records: Iterable[ReplacementRecord],
) -> Surface:
    """The messages to forward: head, applicable checkpoints, the rest of the body with prunes.

    Checkpoints are chosen deepest first (then widest), skipping any that overlap one already
    chosen; prunes apply only outside the chosen checkpoints. Among records that would replace
    the same position, the first committed wins, so forwarded bytes stay stable.
    """
    if len(chain) != len(body):
        raise ValueError("chain and body differ in length")
    count = len(body)

    def shares_prefix(position: int, expected: str) -> bool:
        return 0 <= position < count and chain[position] == expected

    def prev_hash(position: int) -> str:
        return root if position == 0 else chain[position - 1]

    candidates: list[Checkpoint] = []
    prunes: dict[int, Prune] = {}
    for record in records:
        if isinstance(record, Checkpoint):
            if (
                record.end < count - 1
                and shares_prefix(record.end, record.end_hash)
                and prev_hash(record.start) == record.start_prev_hash
            ):
                candidates.append(record)
        elif shares_prefix(record.position, record.hash):
            prunes.setdefault(record.position, record)

    chosen: list[Checkpoint] = []
    for candidate in sorted(candidates, key=lambda r: (-r.end, r.start)):
        if all(candidate.end < c.start or candidate.start > c.end for c in chosen):
            chosen.append(candidate)
    by_start = {c.start: c for c in chosen}

    nodes = [SurfaceNode(message=m, kind="head") for m in head]
    applied_prunes: list[Prune] = []
    position = 0
    while position < count:
        checkpoint = by_start.get(position)
        if checkpoint is not None:
            nodes.append(
                SurfaceNode(checkpoint.message, "checkpoint", checkpoint.start, checkpoint.end)
            )
            position = checkpoint.end + 1
            continue
        prune = prunes.get(position)
        if prune is not None:
            pruned = {**body[position], "content": prune.content}
            nodes.append(SurfaceNode(pruned, "pruned", position, position))
            applied_prunes.append(prune)
        else:
            nodes.append(SurfaceNode(body[position], "body", position, position))
        position += 1

    return Surface(
        nodes=tuple(nodes),
        checkpoints=tuple(sorted(chosen, key=lambda r: r.start)),
        prunes=tuple(applied_prunes),
    )


def missed_checkpoints(
    records: Iterable[ReplacementRecord], surface: Surface, body_length: int
) -> bool:
    """The request is long enough for a committed checkpoint, yet shares the prefix of none.

    A client that rewrites its early messages every turn looks like this on every request.
    """
    reachable = [r for r in records if isinstance(r, Checkpoint) and r.end < body_length - 1]
    return bool(reachable) and not surface.checkpoints
