"""The compaction transaction and its triggers.

Every compaction is one transaction against the store: take the conversation's lease and log
``compaction/start`` → compute replacements with no store lock held → commit (events, records,
generation + 1, lease released) only if the lease is still ours → or log ``compaction/end`` with
an error class and leave the surface untouched. A crash leaves an unmatched start whose lease
expires: stale, never blocking.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from proxy.compaction.prune import PruneCandidate, Pruner, prune_candidates
from proxy.conversation import Prune, ReplacementRecord, Surface
from proxy.meter import Measurement, TokenMeter
from proxy.metrics import COMPACTIONS, TOKENS_SAVED
from proxy.request_view import RequestView
from proxy.store.base import ConversationState, Event, Store

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    COMMITTED = "committed"
    BUSY = "busy"
    CHANGED = "changed"
    NO_RANGE = "no_range"
    NOT_SMALLER = "not_smaller"
    SUMMARY_FAILED = "summary_failed"
    COMMIT_FAILED = "commit_failed"


@dataclass(frozen=True)
class Relief:
    """Where a trigger left the request: state, surface and measurement to forward with."""

    state: ConversationState
    surface: Surface
    measurement: Measurement
    pruned: bool = False
    compacted: bool = False


def _event(event_type: str, **fields: object) -> Event:
    return {"type": event_type, "ts": time.time(), **fields}


class Engine:
    def __init__(self, store: Store, meter: TokenMeter, lease_ttl_seconds: float) -> None:
        self.store = store
        self.meter = meter
        self.lease_ttl = lease_ttl_seconds

    async def _transaction(
        self,
        conversation: str,
        trigger: str,
        kind: str,
        records: Sequence[ReplacementRecord],
        events: Sequence[Event],
    ) -> Outcome:
        """Begin, then commit ``records`` with ``events`` (already computed) in one step."""
        owner = uuid.uuid4().hex
        start = _event("compaction/start", trigger=trigger, kind=kind, owner=owner)
        if not await self.store.begin_compaction(conversation, owner, self.lease_ttl, start):
            return Outcome.BUSY
        end = _event("compaction/end", trigger=trigger, kind=kind, owner=owner, outcome="committed")
        generation = await self.store.commit_compaction(
            conversation, owner, [*events, end], records
        )
        if generation is None:
            await self.store.end_compaction(
                conversation,
                owner,
                _event(
                    "compaction/end",
                    trigger=trigger,
                    kind=kind,
                    owner=owner,
                    outcome="commit_failed",
                    error="commit_failed",
                ),
            )
            return Outcome.COMMIT_FAILED
        return Outcome.COMMITTED

    async def commit_prunes(
        self, view: RequestView, candidates: Sequence[PruneCandidate], trigger: str
    ) -> Outcome:
        records = [
            Prune(
                position=c.position,
                hash=view.chain[c.position],
                content=c.pruned.content,
                chars_before=c.pruned.chars_before,
                chars_after=c.pruned.chars_after,
            )
            for c in candidates
        ]
        events = [
            _event(
                "prune",
                position=r.position,
                hash=r.hash,
                chars_before=r.chars_before,
                chars_after=r.chars_after,
            )
            for r in records
        ]
        outcome = await self._transaction(view.conversation, trigger, "prune", records, events)
        COMPACTIONS.labels(trigger=trigger, mechanism="prune", outcome=outcome.value).inc()
        return outcome

    async def reload(
        self, view: RequestView, state: ConversationState
    ) -> tuple[ConversationState, Surface]:
        fresh = await self.store.load(view.conversation)
        return fresh, view.surface(fresh.records)

    async def prune_step(
        self,
        view: RequestView,
        state: ConversationState,
        surface: Surface,
        pruner: Pruner,
        trigger: str,
    ) -> tuple[ConversationState, Surface, bool]:
        """Prune the surface's oversized tool results; returns the state and surface to use
        next and whether a prune committed. A busy conversation is waited for (bounded)."""
        body_nodes = [n for n in surface.nodes if n.kind == "body" and n.start is not None]
        candidates = prune_candidates(
            [n.start for n in body_nodes if n.start is not None],
            [n.message for n in body_nodes],
            pruner,
        )
        if not candidates:
            return state, surface, False
        outcome = await self.commit_prunes(view, candidates, trigger)
        if outcome is Outcome.BUSY:
            await self.store.wait_for_lease(view.conversation, self.lease_ttl)
        fresh, fresh_surface = await self.reload(view, state)
        return fresh, fresh_surface, outcome is Outcome.COMMITTED

    async def relieve_pressure(
        self,
        view: RequestView,
        state: ConversationState,
        threshold: int,
        pruner: Pruner,
    ) -> Relief:
        """The ``pressure`` trigger: prune, re-measure, stop once below ``threshold``."""
        surface = view.surface(state.records)
        before = view.measure(self.meter, surface, state.anchor)
        measurement = before
        pruned = False
        if measurement.tokens >= threshold:
            state, surface, pruned = await self.prune_step(view, state, surface, pruner, "pressure")
            measurement = view.measure(self.meter, surface, state.anchor)
            if pruned:
                TOKENS_SAVED.labels(mechanism="prune").inc(
                    max(0, before.tokens - measurement.tokens)
                )
        return Relief(state, surface, measurement, pruned=pruned)
