"""What a request tells the background rounds (``proxy.compaction.background``): its limits
with the room its answer needs, and whether a round starts now.

The largest answer so far is a conversation attribute, written with the request's record after
its answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.client_request import ClientRequest
from proxy.compaction import triggers
from proxy.compaction.background import BackgroundCompactions, wants_precompaction
from proxy.compaction.engine import Relief
from proxy.compaction.planning import CompactionJob
from proxy.policy import Budgets, ModelPolicy, answer_reserve
from proxy.store.base import ConversationState

LARGEST_ANSWER = "largest_answer_tokens"  # raised after each answer that beat it


def largest_answer(state: ConversationState) -> int | None:
    """The most completion tokens an answer in this conversation has taken, when known."""
    value = state.attributes.get(LARGEST_ANSWER)
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def answer_attributes(state: ConversationState | None, usage: Mapping[str, Any]) -> dict[str, str]:
    """The conversation's largest answer, raised by this one when it is larger."""
    answer = usage.get("completion_tokens")
    if state is None or not isinstance(answer, int) or isinstance(answer, bool) or answer <= 0:
        return {}
    largest = largest_answer(state)
    return {LARGEST_ANSWER: str(answer)} if largest is None or answer > largest else {}


def pressure_limits(
    model_policy: ModelPolicy,
    window: int | None,
    client_request: ClientRequest,
    state: ConversationState,
) -> Budgets | None:
    """The budgets pressure is measured against, the answer's reserve included; None when
    the proxy does not compact this request by pressure (unknown window, ``auto`` off)."""
    if window is None or not model_policy.policy.auto:
        return None
    reserve = answer_reserve(window, client_request.answer_cap, largest_answer(state))
    return model_policy.budgets(window).with_answer_reserve(reserve)


def maybe_precompact(
    background: BackgroundCompactions, job: CompactionJob, relief: Relief, limits: Budgets | None
) -> bool:
    """Between the watermarks, or over them with the bridge's cuts, prepare the next
    checkpoint in the background; this request goes on at once. Whether a round was started."""
    if limits is None or relief.compacted or relief.shortfall not in (None, triggers.AHEAD):
        return False
    if relief.bridged_from is not None:
        # The round summarizes the conversation as it is, not as the bridge cut it.
        return background.start(job, relief.state, relief.bridged_from, limits)
    tokens = relief.measurement.tokens
    if not wants_precompaction(tokens, limits):
        return False
    return background.start(job, relief.state, tokens, limits)
