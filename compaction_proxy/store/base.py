"""The store contract: one Protocol, two implementations (memory, Redis), one test suite.

A conversation's persistent state is:

* its **log**: an append-only list of events (``message``, ``request``, ``usage``, ``prune``,
  ``compaction/start``, ``compaction/summary``, ``compaction/end``);
* its **replacement records**, written only by a committed compaction, each kept under the
  chain position and hash it ends at (``store.branches``);
* a **generation** counter, bumped by every commit (monotonic);
* the meter **anchor** (upstream-reported prompt tokens of the last forwarded surface);
* **leases** (owner token with a TTL), one held while each compaction runs.

Many operations take the request's ``chain``: what it reads and waits on is then its branch's
alone (the records anchored on its chain, their newest commit as the generation, the leases
anchored on it), so conversations that begin alike never read or wait on each other's.
``chain=None`` is the whole conversation.

Invariants every implementation keeps:

* a message is logged at most once per chain hash, however many requests race;
* at most one live lease on any one chain; an expired lease blocks nothing;
* a commit lands only while its lease is still held by the committer, and lands whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol

from compaction_proxy.conversation.log_events import Event, MessageEvent
from compaction_proxy.conversation.replacements import CheckpointEnd, ReplacementRecord
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.store.attributes import NO_ATTRIBUTES, ConversationAttributes


class StoreUnavailable(Exception):
    """The store could not be reached; the caller serves the request without it."""

    def __init__(self, operation: str, detail: str = "") -> None:
        super().__init__(f"store {operation} failed{': ' + detail if detail else ''}")
        self.operation = operation
        self.detail = detail  # the failure's class, when known (``store.circuit``)


class BeginResult(Enum):
    BEGUN = "begun"  # the lease is ours and compaction/start is logged
    BUSY = "busy"  # another live lease holds the conversation
    STALE = "stale"  # the generation moved past the one the caller derived its surface at


@frozen
class ConversationState:
    records: tuple[ReplacementRecord, ...] = ()
    generation: int = 0
    anchor: Anchor | None = None
    lease_owner: str | None = None
    # The body position where the live lease's compaction ends (its span's last message), when
    # the lease lies on this branch and says (a summary being written: what it will shadow)
    lease_end: int | None = None
    logged_tip: tuple[int, str] | None = None
    attributes: ConversationAttributes = NO_ATTRIBUTES
    # The conversation's last few checkpoints, on any branch (see ``CheckpointEnd``)
    recent_ends: tuple[CheckpointEnd, ...] = ()


@frozen
class ConversationSummary:
    conversation: str
    last_seen: float
    generation: int
    attributes: ConversationAttributes


@frozen
class LogPage:
    events: list[tuple[str, Event]]
    next_cursor: str | None


class Store(Protocol):
    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""

    async def load(
        self, conversation: str, chain: Sequence[str] | None = None
    ) -> ConversationState:
        """Records, generation, anchor and lease of ``chain``'s branch (of the whole
        conversation when None), read in one round trip."""

    async def append(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event] = (),
        attributes: ConversationAttributes | None = None,
    ) -> int:
        """Log the messages not logged yet (by chain hash), then ``events``; set
        ``attributes`` on the conversation. Returns how many messages were new."""

    async def record_request(
        self,
        conversation: str,
        events: Sequence[Event],
        anchor: Anchor | None = None,
        attributes: ConversationAttributes | None = None,
        messages: Sequence[MessageEvent] = (),
        reached: Sequence[ReplacementRecord] = (),
    ) -> None:
        """A request's round trip after its answer (its one before forwarding is ``load``):
        log its ``messages`` not logged yet, then its ``request``/``usage`` ``events``; set
        the new meter anchor (when given) and its attributes; note that its branch still
        reaches the ``reached`` records (records no request reached for the record TTL are
        dropped)."""

    async def begin_compaction(
        self,
        conversation: str,
        owner: str,
        ttl_seconds: float,
        start_event: Event,
        expected_generation: int | None = None,
        chain: Sequence[str] | None = None,
        at: int = -1,
    ) -> BeginResult:
        """Take a lease anchored at ``chain``'s position ``at`` (where the compaction's
        records will end; the whole conversation without a chain) and log
        ``compaction/start`` atomically. BUSY when a live lease lies on ``chain``; STALE
        (nothing written) when ``expected_generation`` is given and the branch's generation
        differs, so a caller never compacts an outdated surface."""

    async def commit_compaction(
        self,
        conversation: str,
        owner: str,
        events: Sequence[Event],
        records: Sequence[ReplacementRecord],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> int | None:
        """While ``owner`` still holds the lease: append events and records, drop the
        ``superseded`` records, bump the generation and release the lease, all at once.
        Returns the new generation, or None (conflict: the lease expired or was taken over,
        nothing was written)."""

    async def end_compaction(self, conversation: str, owner: str, end_event: Event) -> None:
        """Log ``compaction/end`` (with its error) and release the lease if still ours."""

    async def renew_lease(self, conversation: str, owner: str, ttl_seconds: float) -> bool:
        """Extend ``owner``'s lease to ``ttl_seconds`` from now; False when it is no longer
        ``owner``'s (expired or taken over), and then nothing changes."""

    async def read_log(
        self, conversation: str, after: str | None = None, limit: int = 100
    ) -> LogPage:
        """Events in order, ``limit`` at a time, starting after cursor ``after``."""

    async def list_conversations(
        self, limit: int = 50, offset: int = 0
    ) -> list[ConversationSummary]:
        """The most recently active conversations, newest first, skipping the first ``offset``."""

    async def wait_for_lease(
        self, conversation: str, max_wait: float, chain: Sequence[str] | None = None
    ) -> bool:
        """Wait until no live lease lies on ``chain`` (on the conversation when None); False if
        one still does."""

    async def take_quota(
        self, quotas: Sequence[tuple[str, int]], window_seconds: int
    ) -> str | None:
        """Take one unit of every ``(name, limit)`` quota if none already holds ``limit`` calls
        in the last ``window_seconds`` (a sliding window, shared by every replica). Returns
        None when taken, else the name of the first quota at its limit (and takes nothing)."""
        ...

    async def give_back_quota(self, names: Sequence[str], window_seconds: int) -> None:
        """Give back one unit of each named quota (the newest): a call counted that should
        not have been (it concerned one tenant's credential only)."""

    async def claim_objects(self, tenant: str, ids: Sequence[str], ttl_seconds: float) -> None:
        """Record ``tenant`` as the owner of the upstream objects ``ids`` for ``ttl_seconds``;
        an id already owned keeps its owner (``security.owned_objects``)."""

    async def object_owners(self, ids: Sequence[str]) -> list[str | None]:
        """The owner of each of ``ids`` (None: unknown, or its record expired)."""
        ...

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """The secret stored under ``name``, storing ``candidate`` if there is none yet."""

    async def close(self) -> None: ...
