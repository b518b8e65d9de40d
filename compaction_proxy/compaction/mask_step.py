"""The masking step (``masking.py``) on a request: what it would clear and free, priced by the
meter; committed at the threshold by ``triggers.relieve_pressure`` and in overflow recovery, and
between the watermarks by ``mask_ahead``, in place of a summary prepared in the background."""

from __future__ import annotations

import dataclasses

from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.masking import MaskCandidate, mask_candidates, mask_relieves
from compaction_proxy.compaction.model_policy import Budgets
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.metering.meter import counter_for
from compaction_proxy.store.base import ConversationState


@dataclasses.dataclass(frozen=True)
class MaskPlan:
    """What a masking step would clear, the tokens it would free, and the least it must."""

    candidates: list[MaskCandidate]
    saved: int
    clear_at_least: int


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
        shown = {n.start: n.message for n in surface.nodes if n.start is not None}
        saved = 0
        for candidate in candidates:
            message = shown[candidate.position]
            cleared = {**message, "content": candidate.placeholder}
            saved += meter.message(message, count) - meter.message(cleared, count)
        return MaskPlan(candidates, saved, masker.clear_at_least_for(window))

    return await engine.off_loop(job, plan)


async def mask_ahead(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    tokens: int,
    limits: Budgets,
) -> bool:
    """Where a summary would be prepared in the background (between the watermarks), mask
    first: when that frees ``clear_at_least`` and leaves that much room under the precompaction
    watermark, the masks are committed (applied from the next request, as a checkpoint
    prepared ahead would be) and no summary is prepared. ``surface`` is the request's as
    derived from ``state``, measured at ``tokens``. Whether they were."""
    before = await engine.off_loop(
        job, lambda: engine.planner.retained_from(job, surface, limits.retain)
    )
    plan = await mask_plan(engine, job, surface, before)
    if plan is None or not mask_relieves(
        tokens, plan.saved, limits.precompact, plan.clear_at_least
    ):
        return False
    _, _, masked = await engine.mask(job, state, surface, plan.candidates, "precompact", False)
    return masked
