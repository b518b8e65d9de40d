"""Model-free relief: a request brought under its window without a summary call.

Three steps, each taken only when the one before cannot make the request fit, all for the
request at hand alone and never committed (docs/design.md §6):

* **the bridge** (``compaction/bridge.py``): observations cut to head and tail, oldest first,
  as few as it takes;
* **masks** (``compaction/masking.py``): observations before the live turn cleared to their
  one-line placeholder, oldest first, as few as it takes, the newest few kept. The agent's
  calls and reasoning stay, and it can run a tool again; this holds even where the route
  turned masking off, since the only step left would leave out whole turns;
* **dropped turns** (``compaction/drop_turns.py``): when even every mask leaves it over,
  the fewest oldest agent turns after the task left out whole, with a marker in their place
  (the turns kept keep their masks).

They serve the pressure trigger (a request that goes before its checkpoint is ready, or whose
summaries failed) and a request served while the store is out of reach
(``service.without_store``, with an empty state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from compaction_proxy.compaction.bridge import bridge_cuts
from compaction_proxy.compaction.cut_records import mask_records, prune_records
from compaction_proxy.compaction.drop_turns import DroppedTurns, drop_marker, turns_to_drop
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.masking import (
    MaskCuts,
    Masker,
    mask_candidates,
    mask_savings,
    oldest_masks,
)
from compaction_proxy.compaction.model_policy import Budgets
from compaction_proxy.compaction.outcomes import Relief
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.range_selection import first_node_at, priced_nodes
from compaction_proxy.conversation.messages import Message, branch_fingerprint, task_position
from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.metering.meter import Measurement, counter_for
from compaction_proxy.metrics import COMPACTIONS
from compaction_proxy.store.attributes import ShortfallReason
from compaction_proxy.store.base import ConversationState


async def model_free_relief(
    engine: Engine,
    job: CompactionJob,
    pruner: Pruner,
    state: ConversationState,
    surface: Surface,
    before: int,
    measurement: Measurement,
    limits: Budgets,
) -> Relief | None:
    """The bridge's cuts before body position ``before``; failing that, masks; failing
    those, the oldest turns dropped besides; None when nothing brings the request under
    ``must_compact``."""
    bridged = await bridge_relief(engine, job, pruner, state, surface, before, measurement, limits)
    if bridged is not None:
        return bridged
    need = measurement.tokens - limits.must_compact + 1
    masked = await _masks(engine, job, pruner, state, surface, need)
    if masked is None:
        return await drop_relief(engine, job, pruner, state, surface, measurement, limits)
    masked_surface, saved = masked
    tokens = measurement.tokens - saved
    if saved >= need:
        remeasured = await engine.measure(job, state, masked_surface)
        return Relief(
            state,
            masked_surface,
            dataclasses.replace(remeasured, tokens=tokens),
            pruned=True,
            shortfall=ShortfallReason.AHEAD,
            bridged_from=measurement.tokens,
        )
    dropped = await drop_relief(
        engine,
        job,
        pruner,
        state,
        masked_surface,
        dataclasses.replace(measurement, tokens=tokens),
        limits,
    )
    return dropped and dataclasses.replace(dropped, bridged_from=measurement.tokens)


async def _masks(
    engine: Engine,
    job: CompactionJob,
    pruner: Pruner,
    state: ConversationState,
    surface: Surface,
    need: int,
) -> tuple[Surface, int] | None:
    """``surface`` with the fewest oldest observations before the live turn masked that save
    ``need`` tokens, or all of them when that is not enough, and what they save; None when
    none qualifies."""
    view, meter = job.view, engine.meter
    count = counter_for(view.model)
    masker = job.masker or Masker(user_messages=pruner.user_messages)
    masked = {record.position for record in surface.masks}

    def plan() -> MaskCuts:
        candidates = mask_candidates(
            surface.nodes, view.body, view.live_start, masker, masked.__contains__
        )
        price = lambda message: meter.message(message, count)  # noqa: E731
        return oldest_masks(candidates, mask_savings(surface.nodes, candidates, price), need)

    cuts = await engine.off_loop(job, plan)
    outcome = "applied" if cuts.saved >= need else "not_enough"
    COMPACTIONS.labels(trigger="pressure", mechanism="mask", outcome=outcome).inc()
    if not cuts.candidates:
        return None
    return view.surface((*mask_records(job, cuts.candidates), *state.records)), cuts.saved


async def bridge_relief(
    engine: Engine,
    job: CompactionJob,
    pruner: Pruner,
    state: ConversationState,
    surface: Surface,
    before: int,
    measurement: Measurement,
    limits: Budgets,
) -> Relief | None:
    """This request under ``must_compact`` at once, with the bridge's cuts of observations
    before ``before`` (not committed: ``compaction/bridge.py``); None when they cannot get it
    there."""
    view, meter = job.view, engine.meter
    count = counter_for(view.model)
    limit = min(before, view.live_start)
    if state.lease_end is not None:
        # Only what the summary being written will shadow: an observation cut here and sent
        # whole once the checkpoint lands would break the provider's prompt cache twice.
        limit = min(limit, state.lease_end + 1)
    need = measurement.tokens - limits.must_compact + 1
    cuts = await engine.off_loop(
        job,
        lambda: bridge_cuts(
            surface.nodes, view.body, limit, pruner, lambda m: meter.message(m, count), need
        ),
    )
    outcome = "applied" if cuts is not None else "not_enough"
    COMPACTIONS.labels(trigger="pressure", mechanism="bridge", outcome=outcome).inc()
    if cuts is None:
        return None
    bridged = view.surface((*prune_records(job, cuts.cuts), *state.records))
    remeasured = await engine.measure(job, state, bridged)
    # The cuts' saving from where the request stood (anchored, most often): the cuts are in
    # no anchor, so a measure of the bridged surface is a fresh estimate of all of it.
    tokens = measurement.tokens - cuts.saved
    return Relief(
        state,
        bridged,
        dataclasses.replace(remeasured, tokens=tokens),
        pruned=True,
        shortfall=ShortfallReason.AHEAD,
        bridged_from=measurement.tokens,
    )


async def drop_relief(
    engine: Engine,
    job: CompactionJob,
    pruner: Pruner,
    state: ConversationState,
    surface: Surface,
    measurement: Measurement,
    limits: Budgets,
) -> Relief | None:
    """This request under ``must_compact`` with its oldest agent turns left out for a marker
    (``compaction/drop_turns.py``); None when no such cut gets it there."""
    view, meter = job.view, engine.meter
    count = counter_for(view.model)
    body = view.body
    task = task_position(body)
    need = measurement.tokens - limits.must_compact + 1

    def plan() -> DroppedTurns | None:
        nodes = priced_nodes(surface.nodes, meter.node_tokens(view, surface))
        return turns_to_drop(
            nodes,
            task,
            first_node_at(nodes, view.live_start),
            lambda position: _droppable(body, position, task, pruner),
            lambda turns, messages: meter.message(drop_marker(turns, messages), count),
            need,
        )

    dropped = await engine.off_loop(job, plan)
    outcome = "applied" if dropped is not None else "not_enough"
    COMPACTIONS.labels(trigger="pressure", mechanism="drop", outcome=outcome).inc()
    if dropped is None:
        return None
    marker = drop_marker(dropped.turns, dropped.messages)
    record = Checkpoint(
        start=dropped.start,
        end=dropped.end,
        start_prev_hash=view.root if dropped.start == 0 else view.chain[dropped.start - 1],
        end_hash=view.chain[dropped.end],
        message=marker,
        tokens=meter.message(marker, count),
        shadowed_tokens=dropped.saved,
        end_fingerprint=branch_fingerprint(view.body_digests, dropped.end),
        context=view.context_fingerprint,
    )
    trimmed = view.surface((*surface.checkpoints, *surface.prunes, record))
    remeasured = await engine.measure(job, state, trimmed)
    return Relief(
        state,
        trimmed,
        dataclasses.replace(remeasured, tokens=measurement.tokens - dropped.saved),
        pruned=True,
        shortfall=ShortfallReason.AHEAD,
        bridged_from=measurement.tokens,
        dropped_turns=dropped.turns,
    )


def _droppable(body: Sequence[Message], position: int, task: int | None, pruner: Pruner) -> bool:
    """The assistant's messages, tool and function results, and the user messages the pruner
    takes for an agent's observations; never a person's words."""
    role = body[position].get("role")
    if role in ("assistant", "tool", "function"):
        return True
    return role == "user" and pruner.may_cut(body, position, task)
