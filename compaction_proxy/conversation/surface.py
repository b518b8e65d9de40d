"""The surface: the messages a request forwards, its head and body with the replacement records
(``conversation.replacements``) that apply to it.

Pure: plain data in, plain data out, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, overload

from compaction_proxy.conversation.messages import Message, branch_fingerprint
from compaction_proxy.conversation.replacements import (
    Checkpoint,
    CheckpointEnd,
    Prune,
    ReplacementRecord,
    pruned_message,
)
from compaction_proxy.frozen import frozen

NodeKind = Literal["head", "body", "pruned", "checkpoint"]


class SurfaceNode(NamedTuple):
    """One forwarded message and the body positions it stands for (none for the head).

    A named tuple, not a dataclass: every request builds one per message of its history, and
    a tuple is several times cheaper to make than a frozen dataclass."""

    message: Message
    kind: NodeKind
    start: int | None = None
    end: int | None = None


class SentNodes(Sequence[SurfaceNode]):
    """The nodes of a surface that replaces nothing, made only when read: every request
    derives such a surface, and most only count its nodes and forward its messages (the
    request's own), which costs nothing per message here."""

    __slots__ = ("_body", "_head", "_nodes")

    def __init__(self, head: Sequence[Message], body: Sequence[Message]) -> None:
        self._head, self._body = head, body
        self._nodes: tuple[SurfaceNode, ...] | None = None

    def messages(self) -> list[Message]:
        return [*self._head, *self._body]

    def _made(self) -> tuple[SurfaceNode, ...]:
        if self._nodes is None:
            head = [SurfaceNode(m, "head") for m in self._head]
            self._nodes = (*head, *(SurfaceNode(m, "body", i, i) for i, m in enumerate(self._body)))
        return self._nodes

    def __len__(self) -> int:
        return len(self._head) + len(self._body)

    @overload
    def __getitem__(self, index: int) -> SurfaceNode: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[SurfaceNode, ...]: ...
    def __getitem__(self, index: int | slice) -> SurfaceNode | tuple[SurfaceNode, ...]:
        return self._made()[index]

    def __iter__(self) -> Iterator[SurfaceNode]:
        return iter(self._made())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # equal to a tuple, yet not one


@frozen
class Surface:
    nodes: Sequence[SurfaceNode]
    checkpoints: tuple[Checkpoint, ...] = ()
    prunes: tuple[Prune, ...] = ()

    @property
    def messages(self) -> list[Message]:
        if isinstance(self.nodes, SentNodes):
            return self.nodes.messages()
        return [node.message for node in self.nodes]

    @property
    def masks(self) -> tuple[Prune, ...]:
        """The applied prunes that clear an observation (``compaction.masking``)."""
        return tuple(p for p in self.prunes if p.masked)

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
    the same position, a mask wins over a prune, else the first committed wins, so forwarded
    bytes stay stable.
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
            held = prunes.get(record.position)
            if held is None or (record.masked and not held.masked):
                prunes[record.position] = record

    chosen: list[Checkpoint] = []
    for candidate in sorted(candidates, key=lambda r: (-r.end, r.start)):
        if all(candidate.end < c.start or candidate.start > c.end for c in chosen):
            chosen.append(candidate)
    by_start = {c.start: c for c in chosen}

    if not chosen and not prunes:
        return Surface(nodes=SentNodes(head, body))  # the common case, on every request
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
            pruned = pruned_message(body[position], prune)
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


def written_back(
    surface: Surface,
    groups: Sequence[Sequence[int]],
    sent: Sequence[Any],
    pruned: Callable[[Any, Message], Any],
    summary: Callable[[Message], Any],
) -> list[Any]:
    """What to send for ``surface``, from the client's own entries (``sent``: its messages, or
    its Responses items): ``groups[i]`` are the entries message ``i`` (head, then body) stands
    for. Every node the surface keeps is its entries as sent; a pruned node is its entries with
    the last one given ``pruned(entry, pruned_message)``; a checkpoint is ``summary(message)``.
    """
    head = sum(1 for node in surface.nodes if node.kind == "head")
    out: list[Any] = []
    for index, node in enumerate(surface.nodes):
        if node.kind == "checkpoint":
            out.append(summary(node.message))
            continue
        position = index if node.kind == "head" else head + (node.start or 0)
        chosen = [sent[i] for i in groups[position]]
        if node.kind == "pruned" and chosen:
            chosen[-1] = pruned(chosen[-1], node.message)
        out.extend(chosen)
    return out


def missed_checkpoints(
    ends: Iterable[CheckpointEnd], surface: Surface, digests: Sequence[str]
) -> bool:
    """The request applies no checkpoint, yet resends the very messages a committed checkpoint
    ended at (one of ``ends``), with something before them rewritten.

    A client that rewrites an early message every turn looks like this on every request. A
    fork, an edit that starts a new branch, or another conversation that happens to share the
    first message has other messages at that position, so it never counts.
    """
    if surface.checkpoints:
        return False
    return any(
        end.end < len(digests) - 1
        and end.fingerprint != ""
        and branch_fingerprint(digests, end.end) == end.fingerprint
        for end in ends
    )
