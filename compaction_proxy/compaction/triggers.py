"""The compaction triggers (docs/design.md §6): pressure, context overflow, manual, region.

Each is a policy over the engine's transactional steps (prune, summarize a span); none of them
decides whether a request may be retried: that takes evidence from the store (see recovery).
"""

from __future__ import annotations

import dataclasses
import time

from compaction_proxy.compaction.cut_records import prune_records
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.fit import ESTIMATE_MARGIN
from compaction_proxy.compaction.guards.breaker import FailureScope, failure_scope
from compaction_proxy.compaction.mask_step import checkpoint_pays, mask_plan, take_mask_step
from compaction_proxy.compaction.masking import mask_relieves
from compaction_proxy.compaction.model_free import bridge_relief, model_free_relief
from compaction_proxy.compaction.model_policy import Budgets
from compaction_proxy.compaction.outcomes import Outcome, Relief, Round
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.rescue import rescuable, rescue_cuts
from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.meter import Measurement, counter_for
from compaction_proxy.metrics import COMPACTIONS
from compaction_proxy.store.attributes import ConversationAttributes, ShortfallReason
from compaction_proxy.store.base import ConversationState

MAX_WINDOW_SHRINKS = 3


@frozen
class Meanwhile:
    """What other requests committed between two reads of a conversation's state: the request
    that waited for them forwards their work, and says so (``X-Compaction-Status``)."""

    compacted: bool = False  # a checkpoint
    pruned: bool = False  # a pruned observation

    @classmethod
    def between(cls, before: ConversationState, after: ConversationState) -> Meanwhile:
        if after.generation == before.generation:
            return cls()
        new = [record for record in after.records if record not in before.records]
        return cls(
            compacted=any(isinstance(record, Checkpoint) for record in new),
            pruned=any(isinstance(record, Prune) for record in new),
        )


def cooling_down(engine: Engine, state: ConversationState, tokens: int) -> bool:
    """After a failed summary, wait for growth or a cooldown before paying for another."""
    failed_at = state.attributes.compaction_failed_at
    if failed_at is None:
        return False
    recent = time.time() - failed_at < engine.settings.failure_cooldown_seconds
    grown_from = state.attributes.compaction_failed_tokens or 0
    grew = tokens >= grown_from * (1 + engine.settings.failure_growth_ratio)
    return recent and not grew


async def remember_failure(engine: Engine, job: CompactionJob, tokens: int, result: Round) -> None:
    """Put the conversation in the failure cooldown (``cooling_down``) after ``result``, when
    it failed for the conversation's own sake: the summarizer answered, but with nothing
    usable (empty, truncated, not smaller), or the commit failed; the same history would
    likely fail again. An outage, a rate limit or a refused credential is the breaker's to
    wait out (``guards/breaker.py``): it probes, and lets every conversation back in as soon
    as the summarizer answers, where a cooldown per conversation would keep checkpoints off for
    minutes after it healed (the conversation kept under its window by model-free relief
    never grows enough to end it)."""
    failure = result.failure
    if not result.outcome.is_failure or (
        failure is not None and failure_scope(failure.reason) is not FailureScope.ALIVE
    ):
        return
    await engine.store.append(
        job.view.conversation,
        [],
        [],
        attributes=ConversationAttributes(
            compaction_failed_at=time.time(), compaction_failed_tokens=tokens
        ),
    )


async def relieve_pressure(
    engine: Engine, job: CompactionJob, state: ConversationState, limits: Budgets
) -> Relief:
    """The ``pressure`` trigger, cheapest first, the newest messages last:

    1. prune observations older than the retain budget; stop if below the threshold;
    2. mask observations older than the retain budget (``masking.py``) when that frees enough
       to leave ``clear_at_least`` of room under the threshold; stop if below it;
    3. with precompaction on, stop if below ``must_compact`` (shortfall ``ahead``: the caller
       prepares the checkpoint in the background); over it, stop if the bridge's cuts, for
       this request alone, bring it below (``compaction/bridge.py``), on first contact too;
    4. summarize head spans while the surface stays at or above the threshold:
       ``1 + compaction_retries`` rounds, more (up to ``max_rounds``) while each round was cut
       short to fit the summary call;
    5. only if the request would still not fit its window, prune inside the retain budget;
    6. and if it still would not (no summary could be made: the summarizer down, a ceiling,
       a cooldown), the bridge's cuts reach every observation before the live turn, for this
       request alone: it goes within its window rather than to a certain overflow.

    The live turn is never touched here. When it alone (with head and tools) cannot fit the
    window, the history is compacted all the same if the rescue is on (``rescue`` then cuts
    the live turn), else nothing is done: the request goes as sent and the upstream answers.
    A request left at or above the threshold carries the reason (``Relief.shortfall``)."""
    threshold, retain = limits.threshold, limits.retain
    surface = job.view.surface(state.records)
    measurement = await engine.measure(job, state, surface)
    if measurement.tokens < threshold:
        return Relief(state, surface, measurement)
    planner = engine.planner
    irreducible = await engine.off_loop(job, lambda: planner.irreducible_tokens(job, surface))
    if irreducible > limits.window and not (
        job.policy.rescue_live_turn
        and rescuable(surface.nodes, job.view.body, job.view.live_start, job.pruner)
    ):
        return Relief(state, surface, measurement, shortfall=ShortfallReason.LIVE_TURN)
    # A live turn the rescue can cut: the history is compacted as usual, the live turn cut
    # after (``rescue``), and the less history is left, the less of it has to go.
    before = await engine.off_loop(job, lambda: planner.retained_from(job, surface, retain))
    if limits.priced(measurement.tokens):
        return await _priced_relief(engine, job, state, surface, measurement, before, limits)
    bridge = _bridge_for(job, state, limits)
    # Under must_compact nothing waits: a round in the background may hold the lease. Over
    # it, the bridge comes before any wait.
    must_wait = measurement.tokens >= limits.must_compact and bridge is None
    read = state
    state, surface, pruned = await engine.prune(job, state, surface, "pressure", before, must_wait)
    # Not our prune, yet a new generation: another request's round committed while this one
    # waited on its lease (to the client, this request was compacted or pruned before it went).
    meanwhile = Meanwhile() if pruned else Meanwhile.between(read, state)
    pruned = pruned or meanwhile.pruned
    measurement = await engine.measure(job, state, surface)
    if measurement.tokens < threshold:
        return Relief(state, surface, measurement, pruned=pruned, compacted=meanwhile.compacted)
    tokens = measurement.tokens
    masking = await take_mask_step(
        engine, job, state, surface, tokens, before, threshold, limits, "pressure", must_wait
    )
    if masking is not None:
        state, surface, masked = masking
        pruned = pruned or masked
        measurement = await engine.measure(job, state, surface)
        if measurement.tokens < threshold:
            return Relief(state, surface, measurement, pruned=pruned, compacted=meanwhile.compacted)

    if measurement.tokens < limits.must_compact:
        # Precompaction is on: a checkpoint is prepared in the background, no need to wait.
        return Relief(state, surface, measurement, pruned=pruned, shortfall=ShortfallReason.AHEAD)
    if bridge is not None:
        # A history on first contact (no state: new, resumed, or lost by the store) goes at
        # once even when no cut of an observation is enough: its oldest turns are left out
        # while its checkpoint is prepared, instead of rounds of summaries on the request.
        relieve = model_free_relief if _first_contact(state) else bridge_relief
        bridged = await relieve(engine, job, bridge, state, surface, before, measurement, limits)
        if bridged is not None:
            return dataclasses.replace(bridged, compacted=meanwhile.compacted)
    rounds = Relief(state, surface, measurement, shortfall=ShortfallReason.COOLDOWN)
    if not cooling_down(engine, state, measurement.tokens):
        rounds = await _summarize_rounds(engine, job, rounds, threshold, retain)
    state, surface, measurement = rounds.state, rounds.surface, rounds.measurement
    if measurement.tokens > limits.window:
        state, surface, pruned_late = await engine.prune(job, state, surface, "pressure")
        pruned = pruned or pruned_late
        measurement = await engine.measure(job, state, surface)
    if measurement.tokens > limits.window and job.bridge is not None:
        # No summary could be made and the request would overflow: the bridge's cuts reach
        # every observation before the live turn, and failing that the oldest turns are left
        # out, for this request alone (model-free relief).
        reach = job.view.live_start
        cut = await model_free_relief(
            engine, job, job.bridge, state, surface, reach, measurement, limits
        )
        if cut is not None:
            shortfall = rounds.shortfall if cut.measurement.tokens >= threshold else None
            compacted = rounds.compacted or meanwhile.compacted
            return dataclasses.replace(cut, compacted=compacted, shortfall=shortfall)
    return Relief(
        state,
        surface,
        measurement,
        pruned=pruned or rounds.pruned,
        compacted=rounds.compacted or meanwhile.compacted,
        shortfall=rounds.shortfall if measurement.tokens >= threshold else None,
    )


async def _priced_relief(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    measurement: Measurement,
    before: int,
    limits: Budgets,
) -> Relief:
    """Over a soft target's threshold, under the window's own watermark
    (``Budgets.priced``): nothing is needed, so no step goes unless it pays. A mask goes if it
    pays for its cache rewrite. A checkpoint is left to the background, where it is prepared
    if it pays (``pressure.maybe_precompact``); with nothing prepared there (precompaction off,
    or a client that compacts on its own), one that pays is made now, as every checkpoint is
    then. Nothing is pruned here: a prune is priced by no one, and its rewrite can cost a
    short conversation more than sending everything."""
    masked = False
    tokens = measurement.tokens
    masking = await take_mask_step(
        engine, job, state, surface, tokens, before, limits.threshold, limits, "pressure", False
    )
    if masking is not None:
        state, surface, masked = masking
        measurement = await engine.measure(job, state, surface)
    over = measurement.tokens >= limits.threshold
    if (
        over
        and not limits.precompact
        and not cooling_down(engine, state, measurement.tokens)
        and await checkpoint_pays(engine, job, state, surface, measurement.tokens, limits)
    ):
        start = Relief(state, surface, measurement, pruned=masked)
        rounds = await _summarize_rounds(engine, job, start, limits.threshold, limits.retain)
        state, surface, measurement = rounds.state, rounds.surface, rounds.measurement
        over = measurement.tokens >= limits.threshold
        return Relief(
            state,
            surface,
            measurement,
            pruned=masked or rounds.pruned,
            compacted=rounds.compacted,
            shortfall=rounds.shortfall if over else None,
        )
    shortfall = ShortfallReason.SOFT_TARGET if over else None
    return Relief(state, surface, measurement, pruned=masked, shortfall=shortfall)


def _bridge_for(job: CompactionJob, state: ConversationState, limits: Budgets) -> Pruner | None:
    """The bridge's cut for this request, or None: it is off, or precompaction is off (no
    round would be on its way). A history on first contact (a new conversation, a session
    resumed through the proxy, a store that lost its state) is bridged too: it goes at once
    with its older observations cut, and its checkpoint is prepared in the background,
    instead of waiting on rounds of summaries (only when the cuts cannot fit it, it waits)."""
    if not limits.precompact:
        return None
    return job.bridge


def _first_contact(state: ConversationState) -> bool:
    """Whether the store holds nothing of the conversation's compaction: no record, no commit
    ever (a conversation it lost counts as new) and no round under way (a request that
    finds one waits for its checkpoint, as any other does)."""
    return not state.records and state.generation == 0 and state.lease_owner is None


async def rescue(
    engine: Engine, job: CompactionJob, relief: Relief, window: int, answer_cap: int | None
) -> Relief:
    """``relief`` with its live turn's observations cut to fit (``compaction/rescue.py``) when
    the live turn alone (with head and tools) cannot fit the window with the answer the request
    declares: the upstream would refuse it whatever the history. Unchanged otherwise (a request
    over the window for its history is the compaction's, then the overflow recovery's), and
    when no cut makes it fit."""
    room = answer_cap or 0
    need = relief.measurement.tokens + room - window
    if need <= 0:
        return relief
    planner = engine.planner
    irreducible = await engine.off_loop(
        job, lambda: planner.irreducible_tokens(job, relief.surface)
    )
    if irreducible + room <= window:
        return relief
    view, meter = job.view, engine.meter
    count = counter_for(view.model)
    target = need + int(window * (1 - ESTIMATE_MARGIN))  # land a little under: estimates differ
    cuts = await engine.off_loop(
        job,
        lambda: rescue_cuts(
            relief.surface.nodes,
            view.body,
            view.live_start,
            job.pruner,
            lambda m: meter.message(m, count),
            target,
        ),
    )
    outcome = "applied" if cuts is not None else "not_enough"
    COMPACTIONS.labels(trigger="pressure", mechanism="rescue", outcome=outcome).inc()
    if cuts is None:
        return relief
    kept: list[Checkpoint | Prune] = [*relief.surface.checkpoints, *relief.surface.prunes]
    # Sent with their own marker, as cut (no offsets: a pruner's cut would be re-applied).
    cut = [dataclasses.replace(r, head_end=None, tail_start=None) for r in prune_records(job, cuts)]
    rescued = view.surface((*kept, *cut))
    measurement = await engine.measure(job, relief.state, rescued)
    return dataclasses.replace(relief, surface=rescued, measurement=measurement, rescued=True)


async def _summarize_rounds(
    engine: Engine, job: CompactionJob, start: Relief, threshold: int, retain: int
) -> Relief:
    """Summary rounds; ``shortfall`` says why they stopped if the request is still over."""
    state, surface, measurement = start.state, start.surface, start.measurement
    rounds, waits, compacted, pruned = 0, 0, False, False
    shortfall = ShortfallReason.ROUNDS
    allowed = 1 + job.policy.compaction_retries
    while rounds < engine.settings.max_rounds and measurement.tokens >= threshold:
        result = await engine.summarize_round(job, state, surface, retain, "pressure")
        if result.outcome is Outcome.BUSY:
            waits += 1
            if waits > engine.settings.max_busy_waits:
                shortfall = ShortfallReason(result.outcome.value)
                break
            read = state
            state, surface = await engine.wait_and_reload(job)
            meanwhile = Meanwhile.between(read, state)  # the round waited for
            compacted, pruned = compacted or meanwhile.compacted, pruned or meanwhile.pruned
            measurement = await engine.measure(job, state, surface)
            continue
        if result.outcome is not Outcome.COMMITTED or result.state is None:
            await remember_failure(engine, job, measurement.tokens, result)
            shortfall = ShortfallReason(result.outcome.value)
            break
        compacted = True
        rounds += 1
        state = result.state
        surface = job.view.surface(state.records)
        measurement = await engine.measure(job, state, surface)
        limited = result.span is not None and result.span.limited_by_fit
        if rounds >= allowed and not limited:
            break
    return Relief(
        state, surface, measurement, pruned=pruned, compacted=compacted, shortfall=shortfall
    )


async def recover_overflow(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    threshold: int | None,
    window_is_a_guess: bool = False,
) -> None:
    """The ``context-overflow`` trigger: prune, then mask (``masking.py``, before the live
    turn); unless that is clearly enough, summarize
    with ``retain = 0`` (the last node is still kept), more rounds while each was cut short
    to fit the summary call. When the window is only a guess and the summary call itself
    overflows, the guess shrinks (to the limit that error states, else by 40 %) and the round
    is tried again. Whether the request may be retried is not this function's call: the
    caller decides from what the store committed."""
    state, surface = await engine.reload(job)
    state, surface, pruned = await engine.prune(job, state, surface, "context-overflow")
    if threshold is not None:
        tokens = (await engine.measure(job, state, surface)).tokens
        if pruned and tokens < threshold:
            return
        plan = await mask_plan(engine, job, surface, job.view.live_start)
        if plan is not None and mask_relieves(tokens, plan.saved, threshold, plan.clear_at_least):
            state, surface, masked = await engine.mask(
                job, state, surface, plan.candidates, "context-overflow"
            )
            if masked and (await engine.measure(job, state, surface)).tokens < threshold:
                return
    waits = shrinks = 0
    for _ in range(engine.settings.max_rounds):
        result = await engine.summarize_round(job, state, surface, 0, "context-overflow")
        if result.outcome is Outcome.BUSY:
            waits += 1
            if waits > engine.settings.max_busy_waits:
                return
            state, surface = await engine.wait_and_reload(job)
            continue
        failure = result.failure
        if failure is not None and failure.reason == "overflow" and job.window is not None:
            shrinks += 1
            if not window_is_a_guess or shrinks > MAX_WINDOW_SHRINKS:
                return
            job = dataclasses.replace(job, window=failure.limit or int(job.window * 0.6))
            continue
        if result.outcome is not Outcome.COMMITTED or result.state is None:
            return
        state = result.state
        surface = job.view.surface(state.records)
        if result.span is None or not result.span.limited_by_fit:
            return


async def compact_manual(engine: Engine, job: CompactionJob, state: ConversationState) -> Round:
    """The ``manual`` trigger: summarize everything but the last node (``retain = 0``)."""
    return await engine.summarize_round(job, state, job.view.surface(state.records), 0, "manual")


async def compact_region(
    engine: Engine, job: CompactionJob, state: ConversationState, start: int, end: int
) -> Round | str:
    """The ``region`` trigger: summarize body positions ``start..end``; a prior checkpoint
    inside the region is merged. Returns the reason when the region is not a valid span."""
    surface = job.view.surface(state.records)
    plan = engine.planner.plan_region(job, surface, start, end)
    if isinstance(plan, str):
        return plan
    return await engine.compact_span(job, state, plan, "region")
