"""The last resort when no summary can be made (pure): the oldest agent turns left out.

While the summarizer is down (its breaker open, a ceiling, a cooldown) or the store is out of
reach, a request the proxy measured over its window gets model-free relief: prunes, masks and
the bridge's cuts of observations. When even cutting every observation before the live turn
cannot make it fit, the request would meet a certain overflow. Rather than forward that, the
oldest turns after the task are left out of this request, whole, replaced by one marker that
says how many turns went and that a summary will take their place.

Rules, each for a reason:

* the head, the task (the first user message), every checkpoint, the model's last answer and
  the live turn stay: they are what the rest is read in the light of;
* a person's words are never left out: the span holds only the assistant's messages, tool
  and function results, and the user messages the pruner takes for an agent's observations
  (``Pruner.may_cut``). A conversation with a person's message in the way is not trimmed; it
  goes as it is and the upstream answers;
* pairing is kept: the span starts and ends where no tool result is parted from its call
  (``range_selection.balanced_cuts``);
* the fewest turns, oldest first, that bring the request under its target.

The marker is a checkpoint made for this request alone, never committed: the next request
once the summarizer is back is compacted by a real checkpoint over the same turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compaction_proxy.compaction.range_selection import PricedNode, balanced_cuts
from compaction_proxy.conversation.messages import Message
from compaction_proxy.frozen import frozen


@frozen
class DroppedTurns:
    """Surface nodes ``first..last`` (inclusive), body ``start..end``, left out for a marker."""

    first: int
    last: int
    start: int
    end: int
    turns: int  # the assistant messages among them
    messages: int
    saved: int  # their tokens, less the marker's


def drop_marker(turns: int, messages: int) -> Message:
    """The message that stands in for left-out turns."""
    return {
        "role": "user",
        "content": (
            f"[{turns} earlier turn{'s' if turns != 1 else ''} ({messages} messages) of this "
            "conversation were left out here to fit the model's context window, because no "
            "summary of them could be made yet. A summary will take their place. Re-read "
            "files or re-run commands if you need what they showed.]"
        ),
    }


def turns_to_drop(
    nodes: Sequence[PricedNode],
    task: int | None,
    live_from: int,
    droppable: Callable[[int], bool],
    marker_tokens: Callable[[int, int], int],
    need: int,
) -> DroppedTurns | None:
    """The fewest oldest turns whose leaving out saves at least ``need`` tokens, or None.

    ``nodes``: the priced surface; ``task``: the task's body position; ``live_from``: the
    node where the live turn starts; ``droppable(position)``: whether the body message there
    may be left out (never a person's words); ``marker_tokens(turns, messages)``: the price of
    the marker that stands in for them."""
    first = _first_droppable(nodes, task, live_from)
    if first is None:
        return None
    balanced = balanced_cuts([n.message for n in nodes])
    if not balanced[first]:
        return None
    tokens = turns = count = 0
    last_answer = max(
        (i for i in range(first, live_from) if nodes[i].message.get("role") == "assistant"),
        default=first,
    )
    for last in range(first, last_answer):
        node = nodes[last]
        if node.kind not in ("body", "pruned") or node.start is None or node.end is None:
            return None
        if not droppable(node.start):
            return None
        tokens += node.tokens
        count += 1
        turns += node.message.get("role") == "assistant"
        if not balanced[last + 1] or turns == 0:
            continue
        saved = tokens - marker_tokens(turns, count)
        if saved >= need:
            start = nodes[first].start
            assert start is not None  # checked on the loop's first pass
            return DroppedTurns(first, last, start, node.end, turns, count, saved)
    return None


def _first_droppable(nodes: Sequence[PricedNode], task: int | None, live_from: int) -> int | None:
    """The node after the head, the task and every checkpoint before the live turn."""
    first = 0
    for index, node in enumerate(nodes[:live_from]):
        holds_task = (
            task is not None
            and node.start is not None
            and node.end is not None
            and node.start <= task <= node.end
        )
        if node.kind in ("head", "checkpoint") or holds_task:
            first = index + 1
    return first if first < live_from else None
