"""In-process store: the zero-setup default (``memory://``).

Same semantics as the Redis store. Every method runs without awaiting in between its reads and
writes, so each is atomic on the event loop. Memory is bounded: a conversation's log keeps its
newest ``max_log_events`` and at most ``max_log_bytes`` (never more than ``max_bytes``: one
conversation cannot outgrow the store); beyond ``max_conversations``, or ``max_bytes`` of logged
events, the least recently used conversations are evicted; idle ones expire after
``ttl_seconds``.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from compaction_proxy.conversation.log_events import Event, MessageEvent, body_tip
from compaction_proxy.conversation.replacements import (
    CheckpointEnd,
    ReplacementRecord,
    checkpoint_ends,
)
from compaction_proxy.lru import LRU
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.parsing import jsonio
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import BeginResult, ConversationState, ConversationSummary, LogPage
from compaction_proxy.store.branches import (
    AnchoredLease,
    AnchoredLeases,
    AnchoredRecords,
    generation_after,
    lease_anchor,
)
from compaction_proxy.store.log_bound import log_bytes_dropped
from compaction_proxy.store.sliding_windows import SlidingWindows

_LEASE_POLL_SECONDS = 0.02


@dataclass
class _Log:
    """A conversation's events, each as its JSON, back to back in one growing buffer.

    One buffer, not a bytes object per event: those were small blocks kept for days among the
    big buffers every request allocates and frees (its body, its answer), each pinning a hole
    such a buffer left, so the heap kept growing into fresh pages (on an agent's replayed
    traffic, nine page faults a request where the proxy without its log has almost none; one
    with the buffer). Neither is walked by the cyclic garbage collector (a log of dicts made
    every full collection slower the more the store held).

    Event ids are consecutive: the oldest held is ``first_id``; event ``first_id + i`` ends at
    offset ``ends[i]`` of everything ever appended, of which the first ``base`` bytes are no
    longer in ``data`` and the first ``start`` belong to dropped events."""

    data: bytearray = field(default_factory=bytearray)
    ends: list[int] = field(default_factory=list)
    first_id: int = 1
    base: int = 0
    start: int = 0

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def size(self) -> int:
        """Bytes of the events held."""
        return self.base + len(self.data) - self.start

    def append(self, event: bytes) -> None:
        self.data += event
        self.ends.append(self.base + len(self.data))

    def count_over(self, max_bytes: int) -> int:
        """How many of the oldest events to drop so the rest hold at most ``max_bytes`` (the
        newest one is kept whatever its size)."""
        if self.size <= max_bytes or not self.ends:
            return 0
        # The rest then starts where the last dropped event ends: at or past ``keep_from``.
        keep_from = self.ends[-1] - max_bytes
        return min(len(self.ends) - 1, bisect.bisect_left(self.ends, keep_from) + 1)

    def drop_oldest(self, count: int) -> None:
        if count <= 0:
            return
        self.start = self.ends[count - 1]
        del self.ends[:count]
        self.first_id += count
        dead = self.start - self.base
        if dead > len(self.data) // 2:  # each byte is moved at most once on average
            del self.data[:dead]
            self.base = self.start

    def index_after(self, event_id: int) -> int:
        """Where the first event after ``event_id`` is held (``len`` when none is)."""
        return min(len(self.ends), max(0, event_id - self.first_id + 1))

    def event(self, index: int) -> tuple[str, bytes]:
        """The id and JSON of the event held at ``index``."""
        begin = self.ends[index - 1] if index else self.start
        data = bytes(self.data[begin - self.base : self.ends[index] - self.base])
        return f"{self.first_id + index}-0", data


@dataclass
class _Conversation:
    log: _Log = field(default_factory=_Log)
    seen: set[str] = field(default_factory=set)
    records: AnchoredRecords = field(default_factory=AnchoredRecords)
    generation: int = 0
    anchor: Anchor | None = None
    logged_tip: tuple[int, str] | None = None
    attributes: ConversationAttributes = field(default_factory=ConversationAttributes)
    leases: AnchoredLeases = field(default_factory=AnchoredLeases)
    recent_ends: tuple[CheckpointEnd, ...] = ()
    touched: float = 0.0
    log_trimmed: bool = False  # its log was cut to its byte bound (said once)

    @property
    def size(self) -> int:
        """Bytes of the logged events' and the records' JSON: what ``max_bytes`` bounds."""
        return self.log.size + self.records.size

    def trim(self, max_events: int, max_bytes: int) -> int:
        """Drop the oldest events beyond ``max_events``, then those past ``max_bytes``; the
        bytes dropped for the byte bound."""
        self.log.drop_oldest(len(self.log) - max_events)
        before = self.log.size
        self.log.drop_oldest(self.log.count_over(max_bytes))
        dropped = before - self.log.size
        if len(self.seen) > 2 * max_events:
            self.seen.clear()  # only deduplicates logging; a few messages may be logged again
        return dropped

    def add(self, event: Event) -> None:
        self.log.append(jsonio.dumps(event))


def _marked_new(message: MessageEvent, seen: set[str]) -> bool:
    """Marks the message's keys seen, and answers whether it is to be logged: its hash unseen
    and, ``by_content``, its content too. A new hash is marked even when its content was seen
    (as ``lua/log.lua``'s ``seen_mark``): such a message is a duplicate either way."""
    if message.hash in seen:
        return False
    seen.add(message.hash)
    if not message.content_key:
        return True
    content_new = message.content_key not in seen
    seen.add(message.content_key)
    return content_new or not message.by_content


class MemoryStore:
    def __init__(
        self,
        max_conversations: int = 10_000,
        ttl_seconds: float = 7 * 86400,
        max_log_events: int = 10_000,
        max_bytes: int = 512 * 1024 * 1024,
        record_ttl_seconds: float | None = None,
        max_owned_objects: int = 100_000,
        max_log_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        self._secrets: dict[str, bytes] = {}
        # Upstream object id -> (owning tenant, expiry). Bounded: an owner whose record was
        # pushed out is refused its object (404), never shown another's.
        self._owners: LRU[str, tuple[str, float]] = LRU(max_owned_objects)
        self._quotas: dict[int, SlidingWindows] = {}  # by window length
        self._max = max_conversations
        self._ttl = ttl_seconds
        self._record_ttl = min(ttl_seconds, record_ttl_seconds or ttl_seconds)
        self._max_log_events = max_log_events
        self._max_bytes = max_bytes
        self._max_log_bytes = max_log_bytes
        self._bytes = 0

    def _grew(self, conversation: str, entry: _Conversation, before: int) -> None:
        """Account for what ``entry`` logged since it held ``before`` bytes: trim its log to
        its bounds (events, bytes), then evict the least recently used others while the store
        is over its byte bound."""
        # One conversation's log never holds more than the whole store may, records beside it.
        room = min(self._max_log_bytes, self._max_bytes - entry.records.size)
        dropped = entry.trim(self._max_log_events, max(0, room))
        if dropped:
            log_bytes_dropped(conversation, dropped, not entry.log_trimmed)
            entry.log_trimmed = True
        self._bytes += entry.size - before
        while self._bytes > self._max_bytes and len(self._conversations) > 1:
            oldest = next(iter(self._conversations))
            if oldest == conversation:
                break
            self._drop(oldest)

    def _drop(self, name: str) -> None:
        evicted = self._conversations.pop(name)
        self._bytes -= evicted.size

    def seed(self, conversation: str, state: ConversationState) -> None:
        """Start ``conversation`` from ``state`` read from another store (its records, at its
        generation, its anchor, attributes and logged tip): the local copy a fallback goes on
        with (``store/fallback.py``). Replaces what was held of it."""
        if conversation in self._conversations:
            self._drop(conversation)
        entry = self._get(conversation, create=True)
        assert entry is not None
        entry.generation = state.generation
        entry.records.add(state.records, state.generation, time.monotonic())
        entry.anchor, entry.attributes = state.anchor, state.attributes
        entry.logged_tip, entry.recent_ends = state.logged_tip, state.recent_ends
        self._grew(conversation, entry, 0)

    def forget(self, conversation: str) -> None:
        if conversation in self._conversations:
            self._drop(conversation)

    @property
    def size_bytes(self) -> int:
        """About the bytes of logged events held (what ``max_bytes`` bounds)."""
        return self._bytes

    # -- bookkeeping -----------------------------------------------------------------------

    def _get(self, conversation: str, *, create: bool) -> _Conversation | None:
        now = time.monotonic()
        entry = self._conversations.get(conversation)
        if entry is not None and now - entry.touched > self._ttl:
            self._drop(conversation)
            entry = None
        elif entry is not None:
            self._expire_records(entry, now)
        if entry is None:
            if not create:
                return None
            entry = _Conversation()
            self._conversations[conversation] = entry
            while len(self._conversations) > self._max:
                self._drop(next(iter(self._conversations)))
        self._conversations.move_to_end(conversation)
        entry.touched = now
        return entry

    def _expire_records(self, entry: _Conversation, now: float) -> None:
        """Summaries are kept no longer than ``record_ttl_seconds`` after the last write, and
        a branch's no longer than that after a request last reached them."""
        if not entry.records:
            return
        before = entry.records.size
        if now - entry.touched > self._record_ttl:
            entry.records.clear()
        else:
            entry.records.drop_unused(now - self._record_ttl)
        self._bytes -= before - entry.records.size

    def expires_in(self, conversation: str) -> float | None:
        """Seconds until an idle conversation expires (None if unknown); for tests."""
        entry = self._conversations.get(conversation)
        if entry is None:
            return None
        return self._ttl - (time.monotonic() - entry.touched)

    # -- the Store protocol ----------------------------------------------------------------

    async def ping(self) -> None:
        return None

    async def load(
        self, conversation: str, chain: Sequence[str] | None = None
    ) -> ConversationState:
        entry = self._conversations.get(conversation)
        if entry is None:
            return ConversationState()
        now = time.monotonic()
        self._expire_records(entry, now)
        placed, generation = entry.records.branch(chain)
        if chain is None:
            generation = entry.generation
        lease = entry.leases.holding(chain, now)
        return ConversationState(
            records=tuple(p.record for p in placed),
            generation=generation,
            anchor=entry.anchor,
            lease_owner=None if lease is None else lease[0],
            lease_end=None if lease is None or lease[1] < 0 else lease[1],
            logged_tip=entry.logged_tip,
            attributes=entry.attributes,
            recent_ends=entry.recent_ends,
        )

    async def append(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event] = (),
        attributes: ConversationAttributes | None = None,
    ) -> int:
        entry = self._get(conversation, create=True)
        assert entry is not None
        before = entry.size
        added = 0
        for message in messages:
            if _marked_new(message, entry.seen):
                entry.add(message.event)
                added += 1
        tip = body_tip(messages)
        if tip is not None:
            entry.logged_tip = tip
        for event in events:
            entry.add(event)
        if attributes is not None:
            entry.attributes = entry.attributes.updated(attributes)
        self._grew(conversation, entry, before)
        return added

    async def record_request(
        self,
        conversation: str,
        events: Sequence[Event],
        anchor: Anchor | None = None,
        attributes: ConversationAttributes | None = None,
        messages: Sequence[MessageEvent] = (),
        reached: Sequence[ReplacementRecord] = (),
    ) -> None:
        await self.append(conversation, messages, events, attributes)
        entry = self._conversations.get(conversation)
        assert entry is not None
        if anchor is not None:
            entry.anchor = anchor
        entry.records.touch(reached, time.monotonic())

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
        entry = self._get(conversation, create=True)
        assert entry is not None
        now = time.monotonic()
        if entry.leases.holder(chain, now) is not None:
            return BeginResult.BUSY
        if expected_generation is not None:
            generation = entry.generation
            if chain is not None:
                generation = entry.records.branch(chain)[1]
            if generation != expected_generation:
                return BeginResult.STALE
        position, chain_hash = lease_anchor(chain, at)
        entry.leases.by_owner[owner] = AnchoredLease(position, chain_hash, now + ttl_seconds)
        before = entry.size
        entry.add(start_event)
        self._grew(conversation, entry, before)
        return BeginResult.BEGUN

    async def commit_compaction(
        self,
        conversation: str,
        owner: str,
        events: Sequence[Event],
        records: Sequence[ReplacementRecord],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> int | None:
        entry = self._get(conversation, create=False)
        now = time.monotonic()
        if entry is None or entry.leases.live(owner, now) is None:
            return None
        before = entry.size
        for event in events:
            entry.add(event)
        entry.generation = generation_after(entry.generation, time.time())
        entry.records.remove(superseded, entry.generation)
        entry.records.add(records, entry.generation, now)
        entry.recent_ends = tuple(checkpoint_ends(entry.recent_ends, records))
        del entry.leases.by_owner[owner]
        self._grew(conversation, entry, before)
        return entry.generation

    async def renew_lease(self, conversation: str, owner: str, ttl_seconds: float) -> bool:
        entry = self._get(conversation, create=False)
        now = time.monotonic()
        lease = None if entry is None else entry.leases.live(owner, now)
        if entry is None or lease is None:
            return False
        entry.leases.by_owner[owner] = AnchoredLease(
            lease.position, lease.chain_hash, now + ttl_seconds
        )
        return True

    async def end_compaction(self, conversation: str, owner: str, end_event: Event) -> None:
        entry = self._get(conversation, create=True)
        assert entry is not None
        before = entry.size
        entry.add(end_event)
        entry.leases.by_owner.pop(owner, None)
        self._grew(conversation, entry, before)

    async def read_log(
        self, conversation: str, after: str | None = None, limit: int = 100
    ) -> LogPage:
        entry = self._conversations.get(conversation)
        if entry is None:
            return LogPage([], None)
        log = entry.log
        start = 0 if after is None else log.index_after(int(after.split("-")[0]))
        page = [log.event(index) for index in range(start, min(len(log), start + limit))]
        more = start + limit < len(log)
        events = [(event_id, jsonio.loads(data)) for event_id, data in page]
        return LogPage(events, page[-1][0] if page and more else None)

    async def list_conversations(
        self, limit: int = 50, offset: int = 0
    ) -> list[ConversationSummary]:
        now = time.monotonic()
        wall = time.time()
        summaries: list[ConversationSummary] = []
        skipped = 0
        for name in reversed(self._conversations):
            entry = self._conversations[name]
            if now - entry.touched > self._ttl:
                continue
            if skipped < offset:
                skipped += 1
                continue
            last_seen = wall - (now - entry.touched)
            summaries.append(
                ConversationSummary(
                    name,
                    last_seen,
                    entry.generation,
                    entry.attributes,
                )
            )
            if len(summaries) >= limit:
                break
        return summaries

    async def wait_for_lease(
        self, conversation: str, max_wait: float, chain: Sequence[str] | None = None
    ) -> bool:
        deadline = time.monotonic() + max_wait
        while True:
            entry = self._conversations.get(conversation)
            if entry is None or entry.leases.holder(chain, time.monotonic()) is None:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_LEASE_POLL_SECONDS)

    async def claim_objects(self, tenant: str, ids: Sequence[str], ttl_seconds: float) -> None:
        now = time.monotonic()
        for object_id in ids:
            held = self._owners.get(object_id)
            if held is None or held[1] <= now:
                self._owners.put(object_id, (tenant, now + ttl_seconds))

    async def object_owners(self, ids: Sequence[str]) -> list[str | None]:
        now = time.monotonic()
        found = [self._owners.get(object_id) for object_id in ids]
        return [held[0] if held is not None and held[1] > now else None for held in found]

    async def take_quota(
        self, quotas: Sequence[tuple[str, int]], window_seconds: int
    ) -> str | None:
        windows = self._quotas.setdefault(window_seconds, SlidingWindows(window_seconds))
        return windows.take(quotas)

    async def give_back_quota(self, names: Sequence[str], window_seconds: int) -> None:
        windows = self._quotas.get(window_seconds)
        if windows is not None:
            windows.give_back(names)

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        return self._secrets.setdefault(name, candidate)

    async def close(self) -> None:
        self._conversations.clear()
