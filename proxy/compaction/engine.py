"""The compaction transaction and its triggers.

Every compaction is one transaction against the store: take the conversation's lease and log
``compaction/start`` (only if the generation is still the one the surface was derived at) →
compute replacements with no store lock held (the summary call) → commit events and records,
generation + 1 and lease release in one step, only if the lease is still ours → or log
``compaction/end`` with an error class and leave the surface untouched. A crash leaves an
unmatched start whose lease expires: stale, never blocking.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from proxy.compaction.prune import PruneCandidate, Pruner, prune_candidates
from proxy.compaction.select import Span, priced_nodes, select_span
from proxy.compaction.summarize import (
    INSTRUCTION,
    Summary,
    SummaryFailed,
    frame,
    summary_body,
)
from proxy.config import Policy
from proxy.conversation import Checkpoint, Prune, ReplacementRecord, Surface
from proxy.meter import Measurement, TokenMeter, counter_for
from proxy.metrics import COMPACTIONS, SUMMARY_DURATION, TOKENS_SAVED
from proxy.request_view import RequestView
from proxy.store.base import BeginResult, ConversationState, Event, Store

log = logging.getLogger(__name__)

SummaryCall = Callable[[dict[str, Any]], Awaitable[Summary]]

FAILED_AT = "compaction_failed_at"
FAILED_TOKENS = "compaction_failed_tokens"


class Outcome(StrEnum):
    COMMITTED = "committed"
    BUSY = "busy"
    CHANGED = "changed"
    NO_RANGE = "no_range"
    NOT_SMALLER = "not_smaller"
    SUMMARY_FAILED = "summary_failed"
    COMMIT_FAILED = "commit_failed"


@dataclass(frozen=True)
class CompactionJob:
    """One request's compaction inputs: its view, policy, window and summary route."""

    view: RequestView
    policy: Policy
    pruner: Pruner
    window: int | None
    summary_model: str
    summarize: SummaryCall
    route: str = ""


@dataclass(frozen=True)
class Relief:
    """Where a trigger left the request: state, surface and measurement to forward with."""

    state: ConversationState
    surface: Surface
    measurement: Measurement
    pruned: bool = False
    compacted: bool = False


@dataclass(frozen=True)
class Round:
    outcome: Outcome
    span: Span | None = None
    state: ConversationState | None = None
    shadowed_tokens: int = 0


@dataclass(frozen=True)
class EngineSettings:
    lease_ttl_seconds: float = 120.0
    max_rounds: int = 8
    failure_cooldown_seconds: float = 300.0
    failure_growth_ratio: float = 0.1
    max_busy_waits: int = 3


def _event(event_type: str, **fields: object) -> Event:
    return {"type": event_type, "ts": time.time(), **fields}


@dataclass
class Engine:
    store: Store
    meter: TokenMeter
    settings: EngineSettings = field(default_factory=EngineSettings)

    # -- shared steps ----------------------------------------------------------------------

    def measure(
        self, job: CompactionJob, state: ConversationState, surface: Surface
    ) -> Measurement:
        return job.view.measure(self.meter, surface, state.anchor)

    async def reload(self, job: CompactionJob) -> tuple[ConversationState, Surface]:
        fresh = await self.store.load(job.view.conversation)
        return fresh, job.view.surface(fresh.records)

    async def _begin(
        self, job: CompactionJob, state: ConversationState, trigger: str, kind: str, **extra: Any
    ) -> tuple[BeginResult, str]:
        owner = uuid.uuid4().hex
        start = _event(
            "compaction/start",
            trigger=trigger,
            kind=kind,
            owner=owner,
            generation=state.generation,
            **extra,
        )
        result = await self.store.begin_compaction(
            job.view.conversation, owner, self.settings.lease_ttl_seconds, start, state.generation
        )
        return result, owner

    async def _fail(
        self,
        job: CompactionJob,
        owner: str,
        trigger: str,
        kind: str,
        outcome: Outcome,
        detail: str = "",
    ) -> None:
        end = _event(
            "compaction/end",
            trigger=trigger,
            kind=kind,
            owner=owner,
            outcome=outcome.value,
            error=outcome.value,
            detail=detail,
        )
        await self.store.end_compaction(job.view.conversation, owner, end)

    async def _commit(
        self,
        job: CompactionJob,
        owner: str,
        trigger: str,
        kind: str,
        records: Sequence[ReplacementRecord],
        events: Sequence[Event],
    ) -> ConversationState | None:
        end = _event("compaction/end", trigger=trigger, kind=kind, owner=owner, outcome="committed")
        generation = await self.store.commit_compaction(
            job.view.conversation, owner, [*events, end], records
        )
        if generation is None:
            return None
        fresh, _ = await self.reload(job)
        return fresh

    # -- pruning ---------------------------------------------------------------------------

    async def prune(
        self, job: CompactionJob, state: ConversationState, surface: Surface, trigger: str
    ) -> tuple[ConversationState, Surface, bool]:
        """Prune the surface's oversized tool results. Returns the state and surface to go on
        with and whether a prune committed; a busy conversation is waited for (bounded)."""
        body = [n for n in surface.nodes if n.kind == "body" and n.start is not None]
        candidates = prune_candidates(
            [n.start for n in body if n.start is not None], [n.message for n in body], job.pruner
        )
        if not candidates:
            return state, surface, False
        outcome = await self._commit_prunes(job, state, candidates, trigger)
        COMPACTIONS.labels(trigger=trigger, mechanism="prune", outcome=outcome.value).inc()
        if outcome is Outcome.BUSY:
            await self.store.wait_for_lease(job.view.conversation, self.settings.lease_ttl_seconds)
        fresh, fresh_surface = await self.reload(job)
        if outcome is Outcome.COMMITTED:
            saved = sum(c.pruned.chars_before - c.pruned.chars_after for c in candidates)
            log.debug("pruned %d tool results (%d characters)", len(candidates), saved)
        return fresh, fresh_surface, outcome is Outcome.COMMITTED

    async def _commit_prunes(
        self,
        job: CompactionJob,
        state: ConversationState,
        candidates: Sequence[PruneCandidate],
        trigger: str,
    ) -> Outcome:
        view = job.view
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
        began, owner = await self._begin(job, state, trigger, "prune")
        if began is not BeginResult.BEGUN:
            return Outcome.BUSY
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
        if await self._commit(job, owner, trigger, "prune", records, events) is None:
            await self._fail(job, owner, trigger, "prune", Outcome.COMMIT_FAILED)
            return Outcome.COMMIT_FAILED
        return Outcome.COMMITTED

    # -- summarizing -----------------------------------------------------------------------

    def _plan(self, job: CompactionJob, surface: Surface, retain: int) -> tuple[Span | None, int]:
        """The span to summarize and the summary's token cap."""
        view = job.view
        prices = self.meter.node_tokens(view, surface)
        nodes = priced_nodes(surface.nodes, prices)
        cap = job.policy.max_tokens
        budget: int | None = None
        if job.window is not None:
            count = counter_for(job.summary_model)
            fixed = (
                sum(p for n, p in zip(surface.nodes, prices, strict=True) if n.kind == "head")
                + self.meter.tools_tokens(view.tools, count)
                + self.meter.message({"role": "user", "content": INSTRUCTION}, count)
                + 3
            )
            available = int(job.window * 0.97) - fixed
            cap = max(1, min(cap, available // 2))
            budget = available - cap
            if budget <= 0:
                return None, cap
        span = select_span(nodes, retain, budget)
        if span is None:
            return None, cap
        return span, max(1, min(cap, span.tokens))

    async def summarize_round(
        self,
        job: CompactionJob,
        state: ConversationState,
        surface: Surface,
        retain: int,
        trigger: str,
    ) -> Round:
        """Select, summarize and commit one head span."""
        span, cap = self._plan(job, surface, retain)
        if span is None:
            COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome="no_range").inc()
            return Round(Outcome.NO_RANGE)
        began, owner = await self._begin(
            job, state, trigger, "summary", span={"start": span.start, "end": span.end}
        )
        if began is not BeginResult.BEGUN:
            COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome="busy").inc()
            return Round(Outcome.BUSY, span)
        outcome, new_state = await self._summarize_and_commit(
            job, state, surface, span, cap, owner, trigger
        )
        COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome=outcome.value).inc()
        return Round(outcome, span, new_state, span.tokens)

    async def _summarize_and_commit(
        self,
        job: CompactionJob,
        state: ConversationState,
        surface: Surface,
        span: Span,
        cap: int,
        owner: str,
        trigger: str,
    ) -> tuple[Outcome, ConversationState | None]:
        view = job.view
        span_messages = [n.message for n in surface.nodes[span.first : span.last + 1]]
        body = summary_body(job.summary_model, view.head, span_messages, view.tools, cap)
        started = time.perf_counter()
        try:
            summary = await job.summarize(body)
        except SummaryFailed as failure:
            SUMMARY_DURATION.labels(result="failed").observe(time.perf_counter() - started)
            log.warning("summary call failed: %s", failure.reason)
            await self._fail(job, owner, trigger, "summary", Outcome.SUMMARY_FAILED, failure.reason)
            return Outcome.SUMMARY_FAILED, None
        SUMMARY_DURATION.labels(result="ok").observe(time.perf_counter() - started)

        message = frame(summary.text)
        tokens = self.meter.message(message, counter_for(view.model))
        if tokens >= span.tokens:
            await self._fail(
                job, owner, trigger, "summary", Outcome.NOT_SMALLER, f"{tokens} >= {span.tokens}"
            )
            return Outcome.NOT_SMALLER, None
        start_prev = view.root if span.start == 0 else view.chain[span.start - 1]
        record = Checkpoint(
            start=span.start,
            end=span.end,
            start_prev_hash=start_prev,
            end_hash=view.chain[span.end],
            message=message,
            tokens=tokens,
            shadowed_tokens=span.tokens,
        )
        summary_event = _event(
            "compaction/summary",
            summary=summary.text,
            start=span.start,
            end=span.end,
            start_prev_hash=start_prev,
            end_hash=view.chain[span.end],
            shadowed_tokens=span.tokens,
            checkpoint_tokens=tokens,
            route=job.route,
            model=job.summary_model,
            usage=summary.usage,
        )
        fresh = await self._commit(job, owner, trigger, "summary", [record], [summary_event])
        if fresh is None:
            _, reloaded_surface = await self.reload(job)
            deeper = any(c.end >= span.end for c in reloaded_surface.checkpoints)
            outcome = Outcome.CHANGED if deeper else Outcome.COMMIT_FAILED
            await self._fail(job, owner, trigger, "summary", outcome)
            return outcome, None
        TOKENS_SAVED.labels(mechanism="summary").inc(span.tokens - tokens)
        return Outcome.COMMITTED, fresh

    # -- triggers --------------------------------------------------------------------------

    def cooling_down(self, state: ConversationState, tokens: int) -> bool:
        """After a failed summary, wait for growth or a cooldown before paying for another."""
        failed_at = state.attributes.get(FAILED_AT)
        if failed_at is None:
            return False
        recent = time.time() - float(failed_at) < self.settings.failure_cooldown_seconds
        grown_from = float(state.attributes.get(FAILED_TOKENS, "0"))
        grew = tokens >= grown_from * (1 + self.settings.failure_growth_ratio)
        return recent and not grew

    async def _remember_failure(self, job: CompactionJob, tokens: int) -> None:
        await self.store.append(
            job.view.conversation,
            [],
            [],
            attributes={FAILED_AT: f"{time.time():.3f}", FAILED_TOKENS: str(tokens)},
        )

    async def relieve_pressure(
        self, job: CompactionJob, state: ConversationState, threshold: int, retain: int
    ) -> Relief:
        """The ``pressure`` trigger: prune, re-measure; then summarize head spans while the
        surface stays at or above ``threshold``: ``1 + compaction_retries`` rounds, more (up
        to ``max_rounds``) while each round was cut short to fit the summary call."""
        surface = job.view.surface(state.records)
        measurement = self.measure(job, state, surface)
        if measurement.tokens < threshold:
            return Relief(state, surface, measurement)
        state, surface, pruned = await self.prune(job, state, surface, "pressure")
        measurement = self.measure(job, state, surface)
        compacted = False
        if measurement.tokens < threshold or self.cooling_down(state, measurement.tokens):
            return Relief(state, surface, measurement, pruned=pruned)

        rounds, waits = 0, 0
        allowed = 1 + job.policy.compaction_retries
        while rounds < self.settings.max_rounds and measurement.tokens >= threshold:
            result = await self.summarize_round(job, state, surface, retain, "pressure")
            if result.outcome is Outcome.BUSY:
                waits += 1
                if waits > self.settings.max_busy_waits:
                    break
                await self.store.wait_for_lease(
                    job.view.conversation, self.settings.lease_ttl_seconds
                )
                state, surface = await self.reload(job)
                measurement = self.measure(job, state, surface)
                continue
            if result.outcome is not Outcome.COMMITTED or result.state is None:
                if result.outcome is not Outcome.NO_RANGE:
                    await self._remember_failure(job, measurement.tokens)
                break
            compacted = True
            rounds += 1
            state = result.state
            surface = job.view.surface(state.records)
            measurement = self.measure(job, state, surface)
            limited = result.span is not None and result.span.limited_by_fit
            if rounds >= allowed and not limited:
                break
        return Relief(state, surface, measurement, pruned=pruned, compacted=compacted)

    async def recover_overflow(
        self, job: CompactionJob, state: ConversationState, threshold: int | None
    ) -> None:
        """The ``context-overflow`` trigger: prune; unless that is clearly enough, summarize
        with ``retain = 0`` (the last node is still kept), more rounds while each was cut short
        to fit the summary call. Whether the request may be retried is not this method's
        call: the caller decides from what the store committed."""
        state, surface = await self.reload(job)
        state, surface, pruned = await self.prune(job, state, surface, "context-overflow")
        enough = threshold is not None and self.measure(job, state, surface).tokens < threshold
        if pruned and enough:
            return
        waits = 0
        for _ in range(self.settings.max_rounds):
            result = await self.summarize_round(job, state, surface, 0, "context-overflow")
            if result.outcome is Outcome.BUSY:
                waits += 1
                if waits > self.settings.max_busy_waits:
                    return
                await self.store.wait_for_lease(
                    job.view.conversation, self.settings.lease_ttl_seconds
                )
                state, surface = await self.reload(job)
                continue
            if result.outcome is not Outcome.COMMITTED or result.state is None:
                return
            state = result.state
            surface = job.view.surface(state.records)
            if result.span is None or not result.span.limited_by_fit:
                return
