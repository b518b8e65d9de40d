"""What a compaction step comes to: its outcome (``Outcome``, also the outcome label of
``compactions_total``), one summary round's result (``Round``) and where a trigger leaves a
request (``Relief``). Plain data, shared by the engine, the triggers and the service."""

from __future__ import annotations

from enum import StrEnum

from compaction_proxy.compaction.range_selection import Span
from compaction_proxy.compaction.summarize import SummaryFailed
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.meter import Measurement
from compaction_proxy.store.attributes import ShortfallReason
from compaction_proxy.store.base import ConversationState


class Outcome(StrEnum):
    COMMITTED = "committed"
    BUSY = "busy"
    CHANGED = "changed"
    NO_RANGE = "no_range"
    NOT_SMALLER = "not_smaller"
    SUMMARY_FAILED = "summary_failed"
    COMMIT_FAILED = "commit_failed"
    CEILING = "ceiling"  # the tenant reached its summary calls per minute
    BREAKER = "breaker"  # the summary route failed recently: nobody waits for it now
    ERROR = "error"  # an unexpected exception; the attempt was closed on the way out
    CANCELLED = "cancelled"  # shutting down, or the client abandoned the branch

    @property
    def is_failure(self) -> bool:
        """A failure of the summarizer or the commit, after which the conversation cools
        down before paying for another summary (triggers.cooling_down). No span to summarize,
        a guard that refused the call, and another round holding the lease are not."""
        return self not in _NOT_FAILURES


_NOT_FAILURES = frozenset(
    {
        Outcome.COMMITTED,
        Outcome.NO_RANGE,
        Outcome.CEILING,
        Outcome.BREAKER,
        Outcome.BUSY,
        Outcome.CANCELLED,
    }
)


@frozen
class Relief:
    """Where a trigger left the request: state, surface and measurement to forward with."""

    state: ConversationState
    surface: Surface
    measurement: Measurement
    pruned: bool = False
    compacted: bool = False
    shortfall: ShortfallReason | None = None  # why the request is still at or above its threshold
    # The tokens before the bridge (compaction/bridge.py) when the surface carries its cuts.
    bridged_from: int | None = None
    rescued: bool = False  # the live turn's observations cut to fit (compaction/rescue.py)
    dropped_turns: int = 0  # the oldest turns left out for a marker (compaction/drop_turns.py)


@frozen
class Round:
    outcome: Outcome
    span: Span | None = None
    state: ConversationState | None = None
    shadowed_tokens: int = 0
    failure: SummaryFailed | None = None
