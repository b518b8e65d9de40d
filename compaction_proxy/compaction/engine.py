"""The compaction transaction and its triggers.

Every compaction is one transaction against the store: take the conversation's lease and log
``compaction/start`` (only if the generation is still the one the surface was derived at) →
compute replacements with no store lock held (the summary call) → commit events and records,
generation + 1 and lease release in one step, only if the lease is still ours → or log
``compaction/end`` with an error class and leave the surface untouched. A crash leaves an
unmatched start whose lease expires: stale, never blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from compaction_proxy.compaction.cut_records import mask_records, prune_records
from compaction_proxy.compaction.guards.breaker import SummaryBreaker, concerns_the_caller_alone
from compaction_proxy.compaction.guards.ceilings import TENANT_CEILING, SummaryCeilings
from compaction_proxy.compaction.guards.trips import trip
from compaction_proxy.compaction.masking import MaskCandidate
from compaction_proxy.compaction.outcomes import Outcome, Round
from compaction_proxy.compaction.planning import (
    CompactionJob,
    Plan,
    Planner,
    summary_request,
    with_readable_prefix,
)
from compaction_proxy.compaction.prune import prune_candidates
from compaction_proxy.compaction.summarize import SummaryFailed, frame
from compaction_proxy.conversation.log_events import Event
from compaction_proxy.conversation.messages import branch_fingerprint, task_position
from compaction_proxy.conversation.replacements import (
    Checkpoint,
    Prune,
    ReplacementRecord,
    superseded_by,
)
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.meter import Measurement, TokenMeter, counter_for
from compaction_proxy.metering.overflow import NAMELESS_ERROR
from compaction_proxy.metrics import COMPACTIONS, SUMMARY_BREAKER_OPEN, SUMMARY_DURATION
from compaction_proxy.offload import off_loop_if
from compaction_proxy.store.base import BeginResult, ConversationState, Store, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")


@frozen
class EngineSettings:
    # Short, and renewed while a compaction runs: a crashed proxy blocks a conversation for
    # seconds. Waiting for another's compaction is bounded by the summary call instead.
    lease_ttl_seconds: float = 15.0
    lease_wait_seconds: float = 105.0
    breaker_cooldown_seconds: float = 60.0
    max_rounds: int = 8
    failure_cooldown_seconds: float = 300.0
    failure_growth_ratio: float = 0.1
    max_busy_waits: int = 3
    summaries_per_minute_per_tenant: int = 60
    summaries_per_minute_per_route: int = 600
    log_content: bool = True  # False: the summary text is kept only in its record


def _event(event_type: str, **fields: object) -> Event:
    return {"type": event_type, "ts": time.time(), **fields}


@dataclass
class Attempt:
    """One compaction attempt: its job, lease owner token, trigger and kind; ``closed`` once
    its ``compaction/end`` is written (by a commit or a failure)."""

    job: CompactionJob
    owner: str
    trigger: str
    kind: str
    closed: bool = False

    def event(self, event_type: str, **fields: object) -> Event:
        return _event(event_type, trigger=self.trigger, kind=self.kind, owner=self.owner, **fields)


@dataclass
class Engine:
    store: Store
    meter: TokenMeter
    settings: EngineSettings = field(default_factory=EngineSettings)
    ceilings: SummaryCeilings = field(init=False)
    breaker: SummaryBreaker = field(init=False)
    planner: Planner = field(init=False)

    def __post_init__(self) -> None:
        self.planner = Planner(self.meter)
        self.ceilings = SummaryCeilings(
            self.settings.summaries_per_minute_per_tenant,
            self.settings.summaries_per_minute_per_route,
        )
        self.breaker = SummaryBreaker(self.settings.breaker_cooldown_seconds)

    # -- shared steps ----------------------------------------------------------------------

    async def off_loop(self, job: CompactionJob, work: Callable[[], T]) -> T:
        """Run pure ``work`` on ``job``'s request: in a worker thread when the request is big
        (pricing tens of thousands of nodes must not stall other clients), inline otherwise."""
        return await off_loop_if(job.view.big, work)

    async def measure(
        self, job: CompactionJob, state: ConversationState, surface: Surface
    ) -> Measurement:
        """Cache hits once the request was metered; off the loop for a big request all the
        same, since a miss there means tokenizing megabytes."""
        return await self.off_loop(job, lambda: job.view.measure(self.meter, surface, state.anchor))

    async def reload(self, job: CompactionJob) -> tuple[ConversationState, Surface]:
        fresh = await self.store.load(job.view.conversation, job.view.chain)
        return fresh, job.view.surface(fresh.records)

    async def wait_and_reload(self, job: CompactionJob) -> tuple[ConversationState, Surface]:
        """Wait (bounded) for another compaction on this request's branch, then read what it
        committed."""
        view = job.view
        await self.store.wait_for_lease(
            view.conversation, self.settings.lease_wait_seconds, view.chain
        )
        return await self.reload(job)

    async def _begin(
        self,
        job: CompactionJob,
        state: ConversationState,
        trigger: str,
        kind: str,
        end: int,
        **extra: Any,
    ) -> tuple[BeginResult, Attempt]:
        """Take the lease for records ending at body position ``end`` and log
        ``compaction/start``, unless busy or the surface is stale."""
        attempt = Attempt(job, uuid.uuid4().hex, trigger, kind)
        start = attempt.event("compaction/start", generation=state.generation, **extra)
        result = await self.store.begin_compaction(
            job.view.conversation,
            attempt.owner,
            self.settings.lease_ttl_seconds,
            start,
            state.generation,
            job.view.chain,
            end,
        )
        return result, attempt

    async def _fail(self, attempt: Attempt, outcome: Outcome, detail: str = "") -> None:
        """Close the attempt with its error class; the surface stays as it was. Closed only
        once the store has it: a close cut off (the round cancelled at shutdown while it was
        being written) is made again, shielded, by ``_held``, so the lease is not left held."""
        end = attempt.event(
            "compaction/end", outcome=outcome.value, error=outcome.value, detail=detail
        )
        await self.store.end_compaction(attempt.job.view.conversation, attempt.owner, end)
        attempt.closed = True

    @asynccontextmanager
    async def _held(self, attempt: Attempt) -> AsyncIterator[None]:
        """The lease is renewed while the body runs. However the body exits, the attempt is
        closed: an exception (or a path that forgot to) logs ``compaction/end`` with ``error``
        and releases the lease, so no conversation stays locked past a crash of our own."""
        renewal = asyncio.create_task(self._keep_renewed(attempt))
        try:
            yield
        except BaseException as exc:
            # Logged by whoever handles it; here the attempt is only closed.
            cancelled = isinstance(exc, asyncio.CancelledError)
            outcome = Outcome.CANCELLED if cancelled else Outcome.ERROR
            await self._close_quietly(attempt, type(exc).__name__, outcome)
            raise
        else:
            await self._close_quietly(attempt, "left open", Outcome.ERROR)
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal

    async def _close_quietly(self, attempt: Attempt, detail: str, outcome: Outcome) -> None:
        if attempt.closed:
            return
        with contextlib.suppress(Exception):
            # Shielded: a cancelled request must still release what it holds.
            await asyncio.shield(self._fail(attempt, outcome, detail))

    async def _keep_renewed(self, attempt: Attempt) -> None:
        ttl = self.settings.lease_ttl_seconds
        conversation = attempt.job.view.conversation
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                if not await self.store.renew_lease(conversation, attempt.owner, ttl):
                    return  # lost: the commit will be refused
            except StoreUnavailable:
                continue

    async def _commit(
        self,
        attempt: Attempt,
        records: Sequence[ReplacementRecord],
        events: Sequence[Event],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> ConversationState | None:
        """Commit everything at once while the lease is ours; the fresh state, or None."""
        end = attempt.event("compaction/end", outcome="committed")
        conversation = attempt.job.view.conversation
        generation = await self.store.commit_compaction(
            conversation, attempt.owner, [*events, end], records, superseded
        )
        if generation is None:
            return None
        attempt.closed = True
        fresh, _ = await self.reload(attempt.job)
        return fresh

    # -- pruning and masking ---------------------------------------------------------------

    async def prune(
        self,
        job: CompactionJob,
        state: ConversationState,
        surface: Surface,
        trigger: str,
        before: int | None = None,
        wait_if_busy: bool = True,
    ) -> tuple[ConversationState, Surface, bool]:
        """Prune the surface's oversized observations before body position ``before`` (the
        live turn at the latest: it is never pruned). Returns the state and surface to go on
        with and whether a prune committed; a busy conversation is waited for (bounded) if
        ``wait_if_busy``, else left as it is."""
        limit = job.view.live_start if before is None else min(before, job.view.live_start)
        body = [n for n in surface.nodes if n.kind == "body" and n.start is not None]
        body = [n for n in body if n.start is not None and n.start < limit]
        candidates = prune_candidates(
            [n.start for n in body if n.start is not None],
            [n.message for n in body],
            job.pruner,
            task_position(job.view.body),
            job.view.body,
        )
        if not candidates:
            return state, surface, False
        records = prune_records(job, candidates)
        return await self._cut(job, state, surface, records, (), trigger, wait_if_busy)

    async def mask(
        self,
        job: CompactionJob,
        state: ConversationState,
        surface: Surface,
        candidates: Sequence[MaskCandidate],
        trigger: str,
        wait_if_busy: bool = True,
    ) -> tuple[ConversationState, Surface, bool]:
        """Commit masks for ``candidates`` (``masking.py``) over ``surface``, ``state``'s;
        each drops the prune of its own branch at its position, which it replaces. Returns as
        ``prune`` does."""
        if not candidates:
            return state, surface, False
        records = mask_records(job, candidates)
        chain, context = job.view.chain, job.view.context_fingerprint
        cleared = {r.position for r in records}
        superseded = [
            r
            for r in state.records
            if isinstance(r, Prune)
            and r.position in cleared
            and r.context == context
            and chain[r.position] == r.hash
        ]
        return await self._cut(job, state, surface, records, superseded, trigger, wait_if_busy)

    async def _cut(
        self,
        job: CompactionJob,
        state: ConversationState,
        surface: Surface,
        records: Sequence[Prune],
        superseded: Sequence[Prune],
        trigger: str,
        wait_if_busy: bool,
    ) -> tuple[ConversationState, Surface, bool]:
        """One transaction committing prune (or mask) ``records`` and dropping ``superseded``;
        the state and surface to go on with, and whether it committed."""
        mechanism = "mask" if records[0].masked else "prune"
        end = max(record.position for record in records)
        began, attempt = await self._begin(job, state, trigger, mechanism, end)
        outcome = Outcome.BUSY
        if began is BeginResult.BEGUN:
            async with self._held(attempt):
                outcome = await self._commit_cuts(attempt, records, superseded)
        COMPACTIONS.labels(trigger=trigger, mechanism=mechanism, outcome=outcome.value).inc()
        if outcome is Outcome.BUSY and not wait_if_busy:
            return state, surface, False
        if outcome is Outcome.BUSY:
            fresh, fresh_surface = await self.wait_and_reload(job)
        else:
            fresh, fresh_surface = await self.reload(job)
        if outcome is Outcome.COMMITTED:
            saved = sum(r.chars_before - r.chars_after for r in records)
            log.debug("%s: %d observations (%d characters)", mechanism, len(records), saved)
        return fresh, fresh_surface, outcome is Outcome.COMMITTED

    async def _commit_cuts(
        self, attempt: Attempt, records: Sequence[Prune], superseded: Sequence[Prune]
    ) -> Outcome:
        events = [
            _event(
                "mask" if r.masked else "prune",
                position=r.position,
                hash=r.hash,
                chars_before=r.chars_before,
                chars_after=r.chars_after,
                head_end=r.head_end,
                tail_start=r.tail_start,
            )
            for r in records
        ]
        if await self._commit(attempt, records, events, superseded) is None:
            await self._fail(attempt, Outcome.COMMIT_FAILED)
            return Outcome.COMMIT_FAILED
        return Outcome.COMMITTED

    # -- summarizing -----------------------------------------------------------------------

    async def summarize_round(
        self,
        job: CompactionJob,
        state: ConversationState,
        surface: Surface,
        retain: int,
        trigger: str,
    ) -> Round:
        """Select, summarize and commit one head span."""
        plan = await self.off_loop(
            job, lambda: self.planner.plan(job, surface, retain, to_call=True)
        )
        if plan is None:
            COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome="no_range").inc()
            return Round(Outcome.NO_RANGE)
        return await self.compact_span(job, state, plan, trigger)

    async def compact_span(
        self, job: CompactionJob, state: ConversationState, plan: Plan, trigger: str
    ) -> Round:
        """Summarize the plan's span and commit it as one checkpoint."""
        span = plan.span
        summarizer, tenant = job.summarizer, job.view.tenant
        if not self.breaker.allow(summarizer, tenant):
            COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome="breaker").inc()
            return Round(Outcome.BREAKER, span)
        began, attempt = await self._begin(
            job, state, trigger, "summary", span.end, span={"start": span.start, "end": span.end}
        )
        if began is not BeginResult.BEGUN:
            self.breaker.abandoned(summarizer)
            COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome="busy").inc()
            return Round(Outcome.BUSY, span)
        try:
            async with self._held(attempt):
                # A unit of the ceilings is taken only for a call that will be made: once the
                # breaker allowed it and the lease is held.
                refused = await self.ceilings.take(self.store, tenant, job.route)
                if refused is not None:
                    scope = tenant if refused == TENANT_CEILING else job.route
                    trip(refused, scope, "summary calls a minute at their ceiling; not summarizing")
                    await self._fail(attempt, Outcome.CEILING, refused)
                    result = Round(Outcome.CEILING, span)
                else:
                    result = await self._summarize_and_commit(attempt, plan, state.records)
        except Exception:
            COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome="error").inc()
            raise
        finally:
            self.breaker.abandoned(summarizer)  # a probe that never reported frees its slot
        COMPACTIONS.labels(trigger=trigger, mechanism="summary", outcome=result.outcome.value).inc()
        return result

    async def _summarize_and_commit(
        self, attempt: Attempt, plan: Plan, existing: Sequence[ReplacementRecord]
    ) -> Round:
        job = attempt.job
        view = job.view
        span = plan.span
        # Waiting for what it reads is no part of the call's duration.
        request = await with_readable_prefix(summary_request(job, plan))
        started = time.perf_counter()
        summarizer = job.summarizer
        try:
            summary = await job.summarize(request)
        except SummaryFailed as failure:
            SUMMARY_DURATION.labels(result="failed").observe(time.perf_counter() - started)
            log.warning("summary call failed: %s", failure.reason)
            tenant = view.tenant
            kind = failure.kind if failure.caller_credential else NAMELESS_ERROR
            self.breaker.failed(summarizer, tenant, failure.reason, failure.retry_after, kind)
            SUMMARY_BREAKER_OPEN.labels(summarizer).set(self.breaker.is_open(summarizer))
            if concerns_the_caller_alone(failure.reason, failure.caller_credential):
                await self.ceilings.give_back_route(self.store, job.route)
            await self._fail(attempt, Outcome.SUMMARY_FAILED, failure.reason)
            return Round(Outcome.SUMMARY_FAILED, span, failure=failure)
        self.breaker.succeeded(summarizer, view.tenant)
        SUMMARY_BREAKER_OPEN.labels(summarizer).set(0)
        SUMMARY_DURATION.labels(result="ok").observe(time.perf_counter() - started)

        message = frame(summary.text)
        tokens = self.meter.message(message, counter_for(view.model))
        if tokens >= span.tokens:
            await self._fail(attempt, Outcome.NOT_SMALLER, f"{tokens} >= {span.tokens}")
            return Round(Outcome.NOT_SMALLER, span)
        start_prev = view.root if span.start == 0 else view.chain[span.start - 1]
        record = Checkpoint(
            start=span.start,
            end=span.end,
            start_prev_hash=start_prev,
            end_hash=view.chain[span.end],
            message=message,
            tokens=tokens,
            shadowed_tokens=span.tokens,
            end_fingerprint=branch_fingerprint(view.body_digests, span.end),
            context=view.context_fingerprint,
        )
        summary_event = _event(
            "compaction/summary",
            summary=summary.text if self.settings.log_content else None,
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
        superseded = superseded_by(record, existing, view.chain)
        fresh = await self._commit(attempt, [record], [summary_event], superseded)
        if fresh is None:
            _, reloaded_surface = await self.reload(job)
            deeper = any(c.end >= span.end for c in reloaded_surface.checkpoints)
            outcome = Outcome.CHANGED if deeper else Outcome.COMMIT_FAILED
            await self._fail(attempt, outcome)
            return Round(outcome, span)
        return Round(Outcome.COMMITTED, span, fresh, span.tokens)
