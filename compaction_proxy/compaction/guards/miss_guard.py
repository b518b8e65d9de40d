"""The miss guard: a client that rewrites early messages every turn never matches its own
checkpoints, so every request would pay for a new summary. Requests in a row that miss every
committed checkpoint are counted; at ``checkpoint_miss_limit`` proactive compaction stops for
the conversation, and overflow recovery gets at most one summary per cooldown.
"""

from __future__ import annotations

from compaction_proxy.compaction.guards.trips import trip
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.conversation.surface import missed_checkpoints
from compaction_proxy.metrics import CHECKPOINT_MISSES, PROACTIVE_STOPPED
from compaction_proxy.store.base import ConversationState


def proactive_compaction_stopped(misses: int, miss_limit: int) -> bool:
    """Whether a conversation missed its checkpoints too often in a row to be compacted
    proactively any more (``miss_limit`` 0: never stops; pure)."""
    return miss_limit > 0 and misses >= miss_limit


def checkpoint_misses(view: RequestView, state: ConversationState, limit: int) -> int:
    """Requests in a row that missed every committed checkpoint, this one included."""
    misses = state.attributes.misses
    surface = view.surface(state.records)
    ends = state.recent_ends
    if any(end.context for end in ends):  # those made under other instructions do not count
        ends = tuple(end for end in ends if end.context in ("", view.context_fingerprint))
    if missed_checkpoints(ends, surface, view.body_digests):
        misses += 1
        CHECKPOINT_MISSES.inc()
        if misses == limit:
            PROACTIVE_STOPPED.inc()
            trip(
                "miss_guard",
                view.conversation,
                "the conversation keeps missing its own checkpoints (the client rewrites early "
                "messages?): proactive compaction stops for it",
            )
    elif surface.checkpoints:
        misses = 0
    return misses


def recovery_cooling_down(
    last_recovery: float | None, now: float, cooldown_seconds: float, conversation: str
) -> bool:
    """The miss guard covers overflow recovery too: a conversation whose proactive
    compaction stopped gets at most one recovery summary per ``cooldown_seconds``, instead of
    one or more on every request that overflows."""
    if now - (last_recovery or 0.0) < cooldown_seconds:
        trip("recovery_cooldown", conversation, "overflow recovery waits")
        return True
    return False
