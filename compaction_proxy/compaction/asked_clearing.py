"""Old tool results cleared as a client asked (Anthropic's ``clear_tool_uses_20250919``),
for one request: the proxy's masking (``masking.py``) with the client's parameters, never
committed (the client keeps sending its history whole, as the API expects)."""

from __future__ import annotations

from compaction_proxy.compaction.cut_records import mask_records
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.masking import (
    MaskCandidate,
    Masker,
    mask_candidates,
    mask_savings,
    observations,
)
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats.asked_compaction import ClearedToolUses, ClearToolUses
from compaction_proxy.metering.meter import Measurement, counter_for
from compaction_proxy.store.base import ConversationState


async def cleared_tool_uses(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    surface: Surface,
    measurement: Measurement,
    asked: ClearToolUses,
) -> tuple[Surface, ClearedToolUses] | None:
    """``surface`` with every tool result but the newest ``keep`` cleared to its placeholder
    (none of ``exclude_tools``), and what went; None when the trigger is not reached, or less
    than ``clear_at_least`` tokens would go."""
    view, meter = job.view, engine.meter
    count = counter_for(view.model)
    masker = Masker(keep=asked.keep, exclude_tools=asked.exclude_tools, user_messages=False)
    masked = {record.position for record in surface.masks}

    def plan() -> tuple[list[MaskCandidate], int] | None:
        if asked.trigger_tool_uses is not None:
            if len(observations(view.body, False)) < asked.trigger_tool_uses:
                return None
        elif asked.trigger_tokens is not None and measurement.tokens < asked.trigger_tokens:
            return None
        candidates = mask_candidates(
            surface.nodes, view.body, len(view.body), masker, masked.__contains__
        )
        price = lambda message: meter.message(message, count)  # noqa: E731
        return candidates, sum(mask_savings(surface.nodes, candidates, price))

    planned = await engine.off_loop(job, plan)
    if planned is None:
        return None
    candidates, saved = planned
    if not candidates or saved < asked.clear_at_least:
        return None
    records = mask_records(job, candidates)
    ids = [view.body[c.position].get("tool_call_id") for c in candidates]
    cleared = ClearedToolUses(len(candidates), saved, tuple(i for i in ids if isinstance(i, str)))
    return view.surface((*records, *state.records)), cleared
