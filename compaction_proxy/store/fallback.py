"""While the shared store is out of reach, this replica's conversations go on in its own.

Without the store no checkpoint could be read or made: a request past its window went with
model-free relief alone (cuts, dropped turns), for as long as the outage lasted. This wrapper
keeps compaction whole instead, for the conversations this replica serves:

* **read-through while up**: every state the store returns is remembered (the newest
  ``REMEMBERED`` conversations);
* **local while down**: once an operation finds the store out of reach, the conversation goes
  on in an in-process ``MemoryStore`` seeded with what was last read of it (its checkpoints,
  masks and prunes, anchor and attributes): they apply, and new summaries are made, leased and
  committed there. Its log is not kept meanwhile (nobody could read it: the admin API reads the
  store), only what compaction needs;
* **committed back where that is safe**: the first load of such a conversation once the store
  answers commits what was made locally to the store, in one conditional step, only if nobody
  committed to the conversation meanwhile (the generation it was seeded at), or the store came
  back without it (restarted empty: the local copy is then all there is); otherwise the local
  work is dropped and the store's state wins. A conversation whose local round is still running
  waits for a later load. Either way the conversation is then served from the store again.

Object ownership, the shared secret, summary quotas, the admin's listing and log reads never
fall back: they fail as before (ownership fails closed; quotas are counted per process by their
caller). ``ping`` fails too, so readiness still says the store is away.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from compaction_proxy.conversation.log_events import Event, MessageEvent
from compaction_proxy.conversation.replacements import ReplacementRecord
from compaction_proxy.frozen import frozen
from compaction_proxy.lru import LRU
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.metrics import STORE_FALLBACK
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import (
    BeginResult,
    ConversationState,
    ConversationSummary,
    LogPage,
    Store,
    StoreUnavailable,
)
from compaction_proxy.store.memory import MemoryStore

log = logging.getLogger(__name__)

REMEMBERED = 2_000  # conversations whose last read state is kept for a fallback
LOCAL_CONVERSATIONS = 2_000
LOCAL_BYTES = 64 * 1024 * 1024  # the local copies' records, at most
RESTORE_LEASE_SECONDS = 30.0


@frozen
class _Seeded:
    """What a local copy started from: the store's generation then, and its records."""

    generation: int
    records: tuple[ReplacementRecord, ...]


class FallbackStore:
    def __init__(self, primary: Store, local: MemoryStore | None = None) -> None:
        self.primary = primary
        self.local = local or MemoryStore(
            max_conversations=LOCAL_CONVERSATIONS, max_bytes=LOCAL_BYTES, max_log_events=0
        )
        self._remembered: LRU[str, ConversationState] = LRU(REMEMBERED)
        self._seeded: LRU[str, _Seeded] = LRU(LOCAL_CONVERSATIONS)
        self._local_owners: set[str] = set()

    # -- conversations: local while the store is away ----------------------------------------

    async def load(
        self, conversation: str, chain: Sequence[str] | None = None
    ) -> ConversationState:
        try:
            state = await self.primary.load(conversation, chain)
        except StoreUnavailable:
            STORE_FALLBACK.labels(event="served").inc()
            return await self.local.load(self._go_local(conversation), chain)
        if conversation in self._seeded and await self._restore(conversation):
            state = await self.primary.load(conversation, chain)
        self._remembered.put(conversation, state)
        return state

    def _go_local(self, conversation: str) -> str:
        """``conversation``, with a local copy seeded from what was last read of it."""
        if conversation not in self._seeded:
            state = self._remembered.get(conversation) or ConversationState()
            self.local.seed(conversation, state)
            self._seeded.put(conversation, _Seeded(state.generation, state.records))
        return conversation

    def _is_local(self, conversation: str) -> bool:
        return conversation in self._seeded

    async def append(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event] = (),
        attributes: ConversationAttributes | None = None,
    ) -> int:
        try:
            return await self.primary.append(conversation, messages, events, attributes)
        except StoreUnavailable:
            if not self._is_local(conversation):
                raise
            return await self.local.append(conversation, (), (), attributes)

    async def record_request(
        self,
        conversation: str,
        events: Sequence[Event],
        anchor: Anchor | None = None,
        attributes: ConversationAttributes | None = None,
        messages: Sequence[MessageEvent] = (),
        reached: Sequence[ReplacementRecord] = (),
    ) -> None:
        try:
            await self.primary.record_request(
                conversation, events, anchor, attributes, messages, reached
            )
        except StoreUnavailable:
            if not self._is_local(conversation):
                raise
            await self.local.record_request(conversation, (), anchor, attributes, (), reached)

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
        if not self._is_local(conversation):
            try:
                return await self.primary.begin_compaction(
                    conversation, owner, ttl_seconds, start_event, expected_generation, chain, at
                )
            except StoreUnavailable:
                pass
        began = await self.local.begin_compaction(
            self._go_local(conversation),
            owner,
            ttl_seconds,
            start_event,
            expected_generation,
            chain,
            at,
        )
        if began is BeginResult.BEGUN:
            self._local_owners.add(owner)
        return began

    async def commit_compaction(
        self,
        conversation: str,
        owner: str,
        events: Sequence[Event],
        records: Sequence[ReplacementRecord],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> int | None:
        if owner in self._local_owners:
            self._local_owners.discard(owner)
            return await self.local.commit_compaction(conversation, owner, (), records, superseded)
        return await self.primary.commit_compaction(
            conversation, owner, events, records, superseded
        )

    async def end_compaction(self, conversation: str, owner: str, end_event: Event) -> None:
        if owner in self._local_owners:
            self._local_owners.discard(owner)
            await self.local.end_compaction(conversation, owner, end_event)
            return
        await self.primary.end_compaction(conversation, owner, end_event)

    async def renew_lease(self, conversation: str, owner: str, ttl_seconds: float) -> bool:
        if owner in self._local_owners:
            return await self.local.renew_lease(conversation, owner, ttl_seconds)
        return await self.primary.renew_lease(conversation, owner, ttl_seconds)

    async def wait_for_lease(
        self, conversation: str, max_wait: float, chain: Sequence[str] | None = None
    ) -> bool:
        if self._is_local(conversation):
            return await self.local.wait_for_lease(conversation, max_wait, chain)
        return await self.primary.wait_for_lease(conversation, max_wait, chain)

    async def _restore(self, conversation: str) -> bool:
        """Commit what was made locally for ``conversation`` to the store, if nobody committed
        to it there meanwhile; the local copy is dropped either way, unless a local round still
        runs (then nothing happens yet). Whether anything was committed."""
        seeded = self._seeded.get(conversation)
        local = await self.local.load(conversation)
        if seeded is None or local.lease_owner is not None:
            return False
        self._seeded.pop(conversation)
        self.local.forget(conversation)
        expected = seeded.generation
        new = [r for r in local.records if r not in seeded.records]
        gone = [r for r in seeded.records if r not in local.records]
        held = await self.primary.load(conversation)
        if held.generation == 0 and not held.records:
            # The store came back without the conversation (restarted empty, flushed): the
            # local copy is all there is of its compaction.
            expected, new, gone = 0, list(local.records), []
        if not new and not gone:
            return False
        owner = f"restore-{uuid.uuid4().hex}"
        start: Event = {"type": "compaction/start", "trigger": "restore", "owner": owner}
        began = await self.primary.begin_compaction(
            conversation, owner, RESTORE_LEASE_SECONDS, start, expected
        )
        if began is not BeginResult.BEGUN:
            STORE_FALLBACK.labels(event="dropped").inc()
            log.info("work made without the store for %s dropped: it moved on", conversation)
            return False
        end: Event = {"type": "compaction/end", "outcome": "committed", "trigger": "restore"}
        committed = await self.primary.commit_compaction(conversation, owner, [end], new, gone)
        STORE_FALLBACK.labels(event="restored" if committed is not None else "dropped").inc()
        return committed is not None

    # -- everything else: the store's alone ------------------------------------------------

    async def ping(self) -> None:
        await self.primary.ping()

    async def read_log(
        self, conversation: str, after: str | None = None, limit: int = 100
    ) -> LogPage:
        return await self.primary.read_log(conversation, after, limit)

    async def list_conversations(
        self, limit: int = 50, offset: int = 0
    ) -> list[ConversationSummary]:
        return await self.primary.list_conversations(limit, offset)

    async def take_quota(
        self, quotas: Sequence[tuple[str, int]], window_seconds: int
    ) -> str | None:
        return await self.primary.take_quota(quotas, window_seconds)

    async def give_back_quota(self, names: Sequence[str], window_seconds: int) -> None:
        await self.primary.give_back_quota(names, window_seconds)

    async def claim_objects(self, tenant: str, ids: Sequence[str], ttl_seconds: float) -> None:
        await self.primary.claim_objects(tenant, ids, ttl_seconds)

    async def object_owners(self, ids: Sequence[str]) -> list[str | None]:
        return await self.primary.object_owners(ids)

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        return await self.primary.shared_secret(name, candidate)

    async def close(self) -> None:
        await self.primary.close()
        await self.local.close()
