"""The masking step (``masking.py``) on a request, and the price of each step on the provider's
terms (``cache_prices.py``): what a mask would clear and free, what it and a checkpoint would
cost and save. Masks are committed at the threshold by ``triggers.relieve_pressure`` and in
overflow recovery, and between the watermarks by ``mask_ahead``, in place of a summary prepared
in the background; a mask or a checkpoint that is a choice (not a need) is taken only where it
pays."""

from __future__ import annotations

import time

from compaction_proxy.compaction.cache_prices import (
    StepPrice,
    growth_per_turn,
    is_warm,
    net_value,
    turns_ahead,
)
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.masking import (
    MaskCandidate,
    mask_candidates,
    mask_relieves,
    mask_savings,
)
from compaction_proxy.compaction.model_policy import Budgets, precompaction_retain
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.range_selection import first_node_at, priced_nodes
from compaction_proxy.compaction.summarize import INSTRUCTION
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.meter import counter_for
from compaction_proxy.store.base import ConversationState

# What a summary is taken to hold before the conversation has one to judge by (tokens).
SUMMARY_ESTIMATE = 1_500
CHARS_PER_TOKEN = 4  # for the history's size before its cuts: an estimate is enough here


@frozen
class MaskPlan:
    """What a masking step would clear, the tokens it would free, the least it must, and the
    tokens written again behind its first change (from the oldest cleared observation to the
    live turn, as cleared)."""

    candidates: list[MaskCandidate]
    saved: int
    clear_at_least: int
    rewritten: int = 0


async def mask_plan(
    engine: Engine, job: CompactionJob, surface: Surface, before: int
) -> MaskPlan | None:
    """The masking step over ``surface``'s observations before body position ``before``
    (``masking.py``); None when masking is off, the window unknown or nothing qualifies."""
    masker, window = job.masker, job.window
    if masker is None or window is None:
        return None
    view, meter = job.view, engine.meter
    count = counter_for(view.model)
    masked = {record.position for record in surface.masks}

    def plan() -> MaskPlan | None:
        limit = min(before, view.live_start)
        candidates = mask_candidates(surface.nodes, view.body, limit, masker, masked.__contains__)
        if not candidates:
            return None
        saved = sum(
            mask_savings(surface.nodes, candidates, lambda message: meter.message(message, count))
        )
        prices = meter.node_tokens(view, surface)
        oldest = candidates[0].position
        behind = sum(
            price
            for node, price in zip(surface.nodes, prices, strict=True)
            if node.kind != "head"
            and node.start is not None
            and oldest <= node.start < view.live_start
        )
        return MaskPlan(candidates, saved, masker.clear_at_least_for(window), behind - saved)

    return await engine.off_loop(job, plan)


def history_tokens(tokens: int, surface: Surface) -> int:
    """The request's size before any of the proxy's cuts, from its forwarded ``tokens``: what
    its checkpoints shadow and its prunes and masks cleared, added back."""
    shadowed = sum(c.shadowed_tokens - c.tokens for c in surface.checkpoints)
    cleared = sum(p.chars_before - p.chars_after for p in surface.prunes) // CHARS_PER_TOKEN
    return tokens + max(0, shadowed) + max(0, cleared)


async def _value(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    tokens: int,
    step: StepPrice,
    lasts_until: int,
) -> float:
    """What ``step`` saves less what it costs, over the turns ahead: as many as the
    conversation has had, at most until it regrows from ``tokens`` less the step's saving to
    ``lasts_until``."""
    view = job.view
    turns = await engine.off_loop(job, lambda: view.answers)  # counted once per request
    growth = growth_per_turn(history_tokens(tokens, surface), turns)
    ahead = turns_ahead(turns, lasts_until - (tokens - step.saved), growth)
    warm = is_warm(job.prices, state.attributes.last_seen, time.time())
    return net_value(job.prices, step, ahead, warm)


def _next_checkpoint(limits: Budgets) -> int:
    """Where the next checkpoint is taken, summarizing what a step now cleared: the window's
    own watermark under a soft target, else the precompaction watermark (or threshold)."""
    return limits.priced_below or limits.precompact or limits.threshold


async def checkpoint_price(
    engine: Engine, job: CompactionJob, surface: Surface, tokens: int, limits: Budgets
) -> StepPrice | None:
    """A checkpoint prepared now, as the provider would bill it (None: no span to summarize):
    the span less its summary saved, the summary and the retained tail written again, the
    summary call reading the prefix to the span's end. The summary is taken to be as large as
    the conversation's last one (else ``SUMMARY_ESTIMATE``)."""
    view, meter, planner = job.view, engine.meter, engine.planner

    def price() -> StepPrice | None:
        plan = planner.plan(job, surface, precompaction_retain(tokens, limits))
        if plan is None:
            return None
        span = plan.span
        summary = max((c.tokens for c in surface.checkpoints), default=SUMMARY_ESTIMATE)
        summary = min(summary, plan.cap)
        prices = meter.node_tokens(view, surface)
        live = first_node_at(priced_nodes(surface.nodes, prices), view.live_start)
        ask = {"role": "user", "content": INSTRUCTION}
        return StepPrice(
            saved=span.tokens - summary,
            rewritten=summary + sum(prices[span.last + 1 : live]),
            call_read=sum(prices[: span.last + 1]),
            call_written=meter.message(ask, counter_for(view.model)),
            call_output=summary,
        )

    return await engine.off_loop(job, price)


async def checkpoint_pays(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    tokens: int,
    limits: Budgets,
) -> bool:
    """Whether a checkpoint prepared now, under a soft target, saves more than its summary
    call and its cache rewrite cost before the window's own watermark (``limits.
    priced_below``), where one would be taken anyway."""
    step = await checkpoint_price(engine, job, surface, tokens, limits)
    if step is None:
        return False
    return await _value(engine, job, state, surface, tokens, step, limits.priced_below) > 0


async def mask_pays(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    tokens: int,
    plan: MaskPlan,
    limits: Budgets,
) -> bool:
    """Whether ``plan`` is the step to take: its cache rewrite costs less than it saves before
    the next checkpoint summarizes what it cleared, and it is worth at least what a checkpoint
    prepared now would be (the two are the choice here)."""
    until = _next_checkpoint(limits)
    step = StepPrice(saved=plan.saved, rewritten=plan.rewritten)
    value = await _value(engine, job, state, surface, tokens, step, until)
    if value <= 0:
        return False
    checkpoint = await checkpoint_price(engine, job, surface, tokens, limits)
    if checkpoint is None:
        return True
    return value >= await _value(engine, job, state, surface, tokens, checkpoint, until)


async def take_mask_step(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    tokens: int,
    before: int,
    under: int,
    limits: Budgets,
    trigger: str,
    wait_if_busy: bool,
) -> tuple[ConversationState, Surface, bool] | None:
    """The masking step over the observations before body position ``before`` of ``surface``
    (``state``'s, measured at ``tokens``), committed when it frees ``clear_at_least``, leaves
    that much room under ``under`` (``masking.mask_relieves``) and is the step to take on the
    provider's terms (``mask_pays``). None when it is not; else as ``Engine.mask`` returns
    (the state may be newer even when no mask committed: another request's work waited for)."""
    plan = await mask_plan(engine, job, surface, before)
    if (
        plan is None
        or not mask_relieves(tokens, plan.saved, under, plan.clear_at_least)
        or not await mask_pays(engine, job, state, surface, tokens, plan, limits)
    ):
        return None
    return await engine.mask(job, state, surface, plan.candidates, trigger, wait_if_busy)


async def mask_ahead(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    tokens: int,
    limits: Budgets,
) -> bool:
    """Where a summary would be prepared in the background (between the watermarks), mask
    first (``take_mask_step``, room left under the precompaction watermark): the masks are
    committed (applied from the next request, as a checkpoint prepared ahead would be) and no
    summary is prepared. ``surface`` is the request's as derived from ``state``, measured at
    ``tokens``. Whether they were."""
    before = await engine.off_loop(
        job, lambda: engine.planner.retained_from(job, surface, limits.retain)
    )
    masking = await take_mask_step(
        engine, job, state, surface, tokens, before, limits.precompact, limits, "precompact", False
    )
    return masking is not None and masking[2]
