"""Requests forwarded at or above their threshold: why, counted, and said once."""

from __future__ import annotations

import logging

from proxy.compaction import triggers
from proxy.compaction.engine import Relief
from proxy.metrics import OVER_THRESHOLD
from proxy.request_view import RequestView
from proxy.store.base import ConversationState

log = logging.getLogger(__name__)

OVER_THRESHOLD_REASON = "over_threshold"  # the conversation attribute holding the last reason


def report_shortfall(
    view: RequestView, state: ConversationState, route: str, relief: Relief, threshold: int
) -> str:
    """Count a request left at or above its threshold, and log it once per conversation and
    reason. Returns the reason to remember ("" when the request is below its threshold)."""
    if relief.measurement.tokens < threshold:
        return ""
    reason = relief.shortfall or "rounds"
    OVER_THRESHOLD.labels(route=route, reason=reason).inc()
    # Over the threshold by design: the checkpoint is on its way, nothing to warn about.
    if reason != triggers.AHEAD and state.attributes.get(OVER_THRESHOLD_REASON) != reason:
        log.warning(
            "conversation %s is forwarded at %d tokens, at or above its threshold of %d: %s",
            view.conversation,
            relief.measurement.tokens,
            threshold,
            SHORTFALL_REASONS.get(reason, reason),
        )
    return reason


SHORTFALL_REASONS = {
    "live_turn": "the live turn alone (with head and tools) does not fit the window",
    "no_range": "no span of the history can be summarized",
    "summary_failed": "the summary call failed",
    "not_smaller": "the summary was not smaller than what it would replace",
    "ceiling": "the tenant reached its summary ceiling",
    "cooldown": "a recent summary failure is cooling down",
    "stopped": "proactive compaction stopped (the client keeps missing its checkpoints)",
    "busy": "another compaction held the conversation too long",
    "changed": "a deeper checkpoint was committed meanwhile",
    "commit_failed": "the commit failed",
    "rounds": "the compaction rounds ran out",
    "error": "compaction raised an unexpected error (logged above)",
    "store": "the store became unreachable during compaction",
    triggers.AHEAD: "a checkpoint is being prepared in the background",
}
