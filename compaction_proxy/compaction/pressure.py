"""Token pressure on one request: the budgets it is measured against (with the room its answer
needs), whether a checkpoint is prepared ahead in the background, and why a request went at or
above its threshold.

The pressure trigger itself (prune, then summarize) is ``triggers.relieve_pressure``; the
request path runs it only from the threshold up (``service.prepare``). The largest answer so far
is a conversation attribute, written with the request's record after its answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from compaction_proxy.compaction.background import BackgroundCompactions
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.mask_step import checkpoint_pays, mask_ahead
from compaction_proxy.compaction.model_policy import (
    Budgets,
    ModelPolicy,
    answer_reserve,
    wants_precompaction,
)
from compaction_proxy.compaction.outcomes import Relief
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.metrics import OVER_THRESHOLD
from compaction_proxy.store.attributes import NO_ATTRIBUTES, ConversationAttributes, ShortfallReason
from compaction_proxy.store.base import ConversationState

log = logging.getLogger(__name__)


def answer_attributes(
    state: ConversationState | None, usage: Mapping[str, Any]
) -> ConversationAttributes:
    """The conversation's largest answer, raised by this one when it is larger."""
    answer = usage.get("completion_tokens")
    if state is None or not isinstance(answer, int) or isinstance(answer, bool) or answer <= 0:
        return NO_ATTRIBUTES
    largest = state.attributes.largest_answer_tokens
    if largest is None or answer > largest:
        return ConversationAttributes(largest_answer_tokens=answer)
    return NO_ATTRIBUTES


def pressure_limits(
    model_policy: ModelPolicy,
    window: int | None,
    client_request: ClientRequest,
    state: ConversationState,
    client_compacting: bool = False,
) -> Budgets | None:
    """The budgets pressure is measured against, the answer's reserve included; None when
    the proxy does not compact this request by pressure (unknown window, ``auto`` off).
    ``client_compacting``: the client is summarizing its own history (``Budgets.
    for_client_compaction``)."""
    if window is None or not model_policy.policy.auto:
        return None
    largest = state.attributes.largest_answer_tokens
    cap = client_request.answer_cap
    reserve = answer_reserve(window, cap, largest)
    limits = model_policy.budgets(window).with_answer_reserve(reserve).under_declared_cap(cap)
    if client_compacting:
        return limits.for_client_compaction()
    if state.attributes.client_compactions:
        # A client that compacts on its own is left to it: a round prepared ahead would
        # summarize a branch it is about to replace. From the threshold the proxy still
        # compacts (synchronously), so nothing over it reaches the upstream.
        return limits.without_precompaction()
    return limits


async def maybe_precompact(
    engine: Engine,
    background: BackgroundCompactions,
    job: CompactionJob,
    relief: Relief,
    limits: Budgets | None,
) -> CompactionJob | None:
    """Between the watermarks, or over them with the bridge's cuts, prepare the next
    checkpoint in the background, unless masking relieves the conversation instead
    (``mask_step.mask_ahead``); this request goes on at once. The job of the round started,
    if one was: when the request goes as the round sees it, with a ``prompt_answered`` for
    the forwarding to resolve."""
    if limits is None or relief.compacted or relief.shortfall not in BY_DESIGN:
        return None
    if relief.bridged_from is not None:
        # The round summarizes the conversation as it is, not as the bridge cut it.
        started = background.start(job, relief.state, relief.bridged_from, limits)
        return job if started else None
    tokens = relief.measurement.tokens
    if not wants_precompaction(tokens, limits) or not background.could_start(job, relief.state):
        return None
    # Under the threshold, masking comes first; at or over it, it was tried
    # (``relieve_pressure``) and could not relieve the request.
    if tokens < limits.threshold and await mask_ahead(
        engine, job, relief.state, relief.surface, tokens, limits
    ):
        return None
    if limits.priced(tokens) and not await checkpoint_pays(
        engine, job, relief.state, relief.surface, tokens, limits
    ):
        return None
    if not relief.rescued and not relief.dropped_turns:
        answered = asyncio.get_running_loop().create_future()
        job = dataclasses.replace(job, prompt_answered=answered)
    return job if background.start(job, relief.state, tokens, limits) else None


# Shortfalls that are the design's, not a failure's: a checkpoint on its way, or a soft
# target a conversation is over until a step pays. Neither is warned about; after either, a
# round may still be prepared in the background.
BY_DESIGN = frozenset({None, ShortfallReason.AHEAD, ShortfallReason.SOFT_TARGET})


def report_shortfall(
    view: RequestView, state: ConversationState, route: str, relief: Relief, threshold: int
) -> ShortfallReason:
    """Count a request left at or above its threshold, and log it once per conversation and
    reason. Returns the reason to remember (``BELOW_THRESHOLD`` when it is below)."""
    if relief.measurement.tokens < threshold:
        return ShortfallReason.BELOW_THRESHOLD
    reason = relief.shortfall or ShortfallReason.ROUNDS
    OVER_THRESHOLD.labels(route=route, reason=reason.value).inc()
    if reason not in BY_DESIGN and state.attributes.over_threshold is not reason:
        log.warning(
            "conversation %s is forwarded at %d tokens, at or above its threshold of %d: %s",
            view.conversation,
            relief.measurement.tokens,
            threshold,
            SHORTFALL_REASONS[reason],
        )
    return reason


SHORTFALL_REASONS = {
    ShortfallReason.BELOW_THRESHOLD: "below its threshold",
    ShortfallReason.AHEAD: "a checkpoint is being prepared in the background",
    ShortfallReason.SOFT_TARGET: (
        "it is over its soft target only, where a step is taken when it pays for itself"
    ),
    ShortfallReason.LIVE_TURN: "the live turn alone (with head and tools) does not fit the window",
    ShortfallReason.NO_RANGE: "no span of the history can be summarized",
    ShortfallReason.SUMMARY_FAILED: "the summary call failed",
    ShortfallReason.NOT_SMALLER: "the summary was not smaller than what it would replace",
    ShortfallReason.CEILING: "the tenant reached its summary ceiling",
    ShortfallReason.BREAKER: "the summary route failed recently (its breaker is open)",
    ShortfallReason.COOLDOWN: "a recent summary failure is cooling down",
    ShortfallReason.STOPPED: (
        "proactive compaction stopped (the client keeps missing its checkpoints)"
    ),
    ShortfallReason.BUSY: "another compaction held the conversation too long",
    ShortfallReason.CHANGED: "a deeper checkpoint was committed meanwhile",
    ShortfallReason.COMMIT_FAILED: "the commit failed",
    ShortfallReason.ROUNDS: "the compaction rounds ran out",
    ShortfallReason.ERROR: "compaction raised an unexpected error (logged above)",
    ShortfallReason.STORE: "the store became unreachable during compaction",
}
