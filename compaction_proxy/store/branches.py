"""A conversation's replacement records and leases, indexed by where on a chain they sit.

Conversations without a session id are named by their first message, so every conversation
that opens with "hi" shares one name: its log, its attributes, its generation counter. What
must not be shared is what a request reads and waits on. So each record is kept under its
**anchor**, the chain position and hash it ends at (``anchor_of``), and a request reads only
the records anchored on its own chain: the positions that hold any are few, and at each it
looks up one hash, however many twins the conversation has. Leases are anchored the same way,
at the end of the span being compacted: a request waits only for a compaction whose result
will lie on its chain, so twins never wait on each other. A branch's generation is the newest
commit among the records it reads.

``chain=None`` stands for the whole conversation (the admin view, and callers that know no
chain): every record, the conversation's generation counter, and a lease that covers every
branch. The in-process store keeps this index as it is; the Redis store keeps the same shape in
hashes (see ``lua/branches.lua``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from compaction_proxy.conversation.replacements import (
    Checkpoint,
    ReplacementRecord,
    record_to_dict,
)
from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio

ORDER_BITS = 16  # a record's order: its commit's generation, then its index in the commit
# Generations count from here, in tenths of a second (``generation_after``); lua/commit.lua
# holds the same figure.
GENERATION_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z
WHOLE_CONVERSATION = -1  # a lease position that lies on every chain


def anchor_of(record: ReplacementRecord) -> tuple[int, str]:
    """The chain position and hash a record ends at: a request can apply it only if its own
    chain holds that hash there."""
    if isinstance(record, Checkpoint):
        return record.end, record.end_hash
    return record.position, record.hash


def on_chain(chain: Sequence[str] | None, position: int, chain_hash: str) -> bool:
    """Whether ``chain`` holds ``chain_hash`` at ``position``; the whole conversation (None)
    holds every anchor, and a whole-conversation anchor lies on every chain."""
    if chain is None or position == WHOLE_CONVERSATION:
        return True
    return 0 <= position < len(chain) and chain[position] == chain_hash


def order_of(generation: int, index: int) -> int:
    if not 0 <= index < 1 << ORDER_BITS:
        raise ValueError(f"a commit holds at most {1 << ORDER_BITS} records")
    return generation << ORDER_BITS | index


def generation_of(order: int) -> int:
    return order >> ORDER_BITS


def generation_after(counter: int, now: float) -> int:
    """The generation a commit takes: one past ``counter``, and never below the clock (tenths
    of a second since ``GENERATION_EPOCH``). A store that lost a conversation (flushed,
    restarted empty, its keys expired) counts it again from 0; from the clock, its next commit
    still lands past every generation it had, unless that conversation committed more than
    ten times a second, so an ``X-Compaction-Generation`` never repeats with other content
    and a surface derived before the loss never passes for a current one. Its orders
    (``order_of``) stay below 2**53, which Redis's Lua numbers hold exactly, for centuries."""
    return max(counter + 1, int((now - GENERATION_EPOCH) * 10))


@frozen
class Placed:
    """A record as held: its commit order and the bytes of its JSON."""

    order: int
    record: ReplacementRecord
    size: int


@dataclass
class AnchoredRecords:
    """The in-process form of the index. ``size`` is the bytes of the records' JSON held;
    ``used`` is when a request last reached each anchor (see ``drop_unused``), least recently
    first (times come from a monotonic clock)."""

    by_anchor: dict[tuple[int, str], list[Placed]] = field(default_factory=dict)
    by_position: dict[int, set[str]] = field(default_factory=dict)
    used: dict[tuple[int, str], float] = field(default_factory=dict)
    # The last commit that dropped records at an anchor: a branch that read them counts it,
    # so its generation never goes back when a twin's checkpoint supersedes a shared record.
    dropped_by: dict[tuple[int, str], int] = field(default_factory=dict)
    size: int = 0

    def __bool__(self) -> bool:
        return bool(self.by_anchor)

    def on(self, chain: Sequence[str] | None) -> list[Placed]:
        """The records anchored on ``chain``, in commit order."""
        return self.branch(chain)[0]

    def branch(self, chain: Sequence[str] | None) -> tuple[list[Placed], int]:
        """The records anchored on ``chain``, in commit order, and the newest commit that
        added or dropped any there: the branch's generation."""
        if not self.by_position and chain is not None:
            return [], 0  # nothing anchored anywhere: a conversation that never compacted
        if chain is None:
            anchors = list(self.by_anchor)
        else:
            anchors = [
                (position, chain[position])
                for position, hashes in self.by_position.items()
                if position < len(chain) and chain[position] in hashes
            ]
        found = [placed for anchor in anchors for placed in self.by_anchor[anchor]]
        found.sort(key=lambda placed: placed.order)
        newest = max((generation_of(placed.order) for placed in found), default=0)
        newest = max([newest, *(self.dropped_by.get(anchor, 0) for anchor in anchors)])
        return found, newest

    def add(self, records: Sequence[ReplacementRecord], generation: int, now: float) -> None:
        for index, record in enumerate(records):
            anchor = anchor_of(record)
            size = len(jsonio.dumps(record_to_dict(record)))
            placed = Placed(order_of(generation, index), record, size)
            self.by_anchor.setdefault(anchor, []).append(placed)
            self.by_position.setdefault(anchor[0], set()).add(anchor[1])
            self._use(anchor, now)
            self.size += size

    def remove(self, records: Iterable[ReplacementRecord], generation: int) -> None:
        """Drop ``records`` (superseded by commit ``generation``); their anchors stay, marked
        with it, until no request reaches them."""
        for record in records:
            anchor = anchor_of(record)
            held = self.by_anchor.get(anchor)
            if held is None:
                continue
            for placed in held:
                if placed.record == record:
                    held.remove(placed)
                    self.size -= placed.size
                    break
            self.dropped_by[anchor] = generation

    def touch(self, records: Iterable[ReplacementRecord], now: float) -> None:
        for record in records:
            anchor = anchor_of(record)
            if anchor in self.by_anchor:
                self._use(anchor, now)

    def drop_unused(self, since: float) -> None:
        """Drop the records at every anchor no request reached since ``since``: those of a
        branch nobody continues (a twin that never came back, a history its client edited).
        Costs what it drops, not what is held: the least recently used come first."""
        while self.used:
            anchor, when = next(iter(self.used.items()))
            if when >= since:
                return
            self.size -= sum(placed.size for placed in self.by_anchor.get(anchor, []))
            self._forget(anchor)

    def _use(self, anchor: tuple[int, str], now: float) -> None:
        self.used.pop(anchor, None)
        self.used[anchor] = now  # and last in order

    def clear(self) -> None:
        self.by_anchor.clear()
        self.by_position.clear()
        self.used.clear()
        self.dropped_by.clear()
        self.size = 0

    def _forget(self, anchor: tuple[int, str]) -> None:
        self.by_anchor.pop(anchor, None)
        self.used.pop(anchor, None)
        self.dropped_by.pop(anchor, None)
        hashes = self.by_position.get(anchor[0])
        if hashes is not None:
            hashes.discard(anchor[1])
            if not hashes:
                del self.by_position[anchor[0]]


@frozen
class AnchoredLease:
    position: int
    chain_hash: str
    expires: float


def lease_anchor(chain: Sequence[str] | None, at: int) -> tuple[int, str]:
    """Where a lease taken by a request with ``chain`` for a compaction ending at ``at`` sits:
    the whole conversation when the chain is not known."""
    if chain is None or not 0 <= at < len(chain):
        return WHOLE_CONVERSATION, ""
    return at, chain[at]


@dataclass
class AnchoredLeases:
    """The in-process leases: owner -> where its compaction ends, and until when it holds."""

    by_owner: dict[str, AnchoredLease] = field(default_factory=dict)

    def holder(self, chain: Sequence[str] | None, now: float) -> str | None:
        """The owner of a live lease on ``chain``, if any; expired ones are dropped."""
        found = self.holding(chain, now)
        return None if found is None else found[0]

    def holding(self, chain: Sequence[str] | None, now: float) -> tuple[str, int] | None:
        """The owner of a live lease on ``chain`` and where its compaction ends (a body
        position; ``WHOLE_CONVERSATION`` when not known), if any; expired ones are dropped."""
        found = None
        for owner, lease in list(self.by_owner.items()):
            if lease.expires <= now:
                del self.by_owner[owner]
            elif found is None and on_chain(chain, lease.position, lease.chain_hash):
                found = owner, lease.position
        return found

    def live(self, owner: str, now: float) -> AnchoredLease | None:
        lease = self.by_owner.get(owner)
        return lease if lease is not None and lease.expires > now else None
