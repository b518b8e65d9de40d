"""Range selection (pure): which leading span of the body to summarize.

Over the priced surface nodes: the head is never selected; walking back from the tail, nodes
are kept while they fit the ``retain`` budget (the last node always); the cut then moves toward
the head until no tool result after it answers a call opened before it. The span is everything
between the head and the cut. It must also fit the summary call (head + tools + span +
instruction + summary cap within the window); otherwise the largest balanced head span that
fits is taken, and the caller may run another round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.conversation import Message


@dataclass(frozen=True)
class PricedNode:
    message: Message
    tokens: int
    kind: str  # "head" | "body" | "pruned" | "checkpoint"
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True)
class Span:
    """Surface nodes ``first..last`` (inclusive), standing for body ``start..end``."""

    first: int
    last: int
    start: int
    end: int
    tokens: int
    limited_by_fit: bool = False


def _call_ids(message: Message) -> list[str]:
    calls = message.get("tool_calls") or []
    return [str(c.get("id")) for c in calls if isinstance(c, dict) and c.get("id") is not None]


def balanced_cuts(messages: Sequence[Message]) -> list[bool]:
    """``result[i]``: cutting before message ``i`` separates no tool result from its call.

    ``result[len(messages)]`` is always True.
    """
    answered_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        if message.get("role") == "tool" and message.get("tool_call_id") is not None:
            answered_at.setdefault(str(message["tool_call_id"]), index)
    # A call opened at i and answered at j forbids every cut in (i, j].
    forbidden = [0] * (len(messages) + 2)
    for index, message in enumerate(messages):
        for call_id in _call_ids(message):
            answer = answered_at.get(call_id)
            if answer is not None and answer > index:
                forbidden[index + 1] += 1
                forbidden[answer + 1] -= 1
    result: list[bool] = []
    running = 0
    for index in range(len(messages) + 1):
        running += forbidden[index]
        result.append(running == 0)
    return result


def select_span(
    nodes: Sequence[PricedNode],
    retain: int,
    summary_budget: int | None = None,
) -> Span | None:
    """The span to summarize, or None when there is no useful one.

    ``summary_budget``: the most span tokens the summary call can carry (window minus head,
    tools, instruction and summary cap); None when unbounded.
    """
    head = sum(1 for n in nodes if n.kind == "head")
    count = len(nodes)
    if count - head < 2:
        return None
    balanced = balanced_cuts([n.message for n in nodes])

    cut = count - 1  # the first kept node; the last node is always kept
    kept = nodes[cut].tokens
    while cut > head and kept + nodes[cut - 1].tokens <= retain:
        cut -= 1
        kept += nodes[cut].tokens
    while cut > head and not balanced[cut]:
        cut -= 1

    limited = False
    if summary_budget is not None:
        while cut > head and (_tokens(nodes, head, cut) > summary_budget or not balanced[cut]):
            cut -= 1
            limited = True
    if cut <= head:
        return None
    first, last = head, cut - 1
    if first == last and nodes[first].kind == "checkpoint":
        return None  # re-summarizing a lone summary gains nothing
    start, end = nodes[first].start, nodes[last].end
    if start is None or end is None:
        return None
    return Span(first, last, start, end, _tokens(nodes, first, cut), limited)


def _tokens(nodes: Sequence[PricedNode], first: int, stop: int) -> int:
    return sum(n.tokens for n in nodes[first:stop])


def priced_nodes(surface_nodes: Sequence[Any], prices: Sequence[int]) -> list[PricedNode]:
    return [
        PricedNode(n.message, p, n.kind, n.start, n.end)
        for n, p in zip(surface_nodes, prices, strict=True)
    ]


def region_span(nodes: Sequence[PricedNode], body_length: int, start: int, end: int) -> Span | str:
    """The span standing for body positions ``start..end`` (inclusive), or why there is none:
    out of range, the last message (always kept), a cut inside an existing checkpoint, or a cut
    that separates a tool result from its call."""
    if not 0 <= start <= end < body_length:
        return f"positions {start}..{end} are out of range (the body has {body_length} messages)"
    if end == body_length - 1:
        return "the last message is always kept: end must be before it"
    first = next((i for i, n in enumerate(nodes) if n.kind != "head" and n.start == start), None)
    last = next((i for i, n in enumerate(nodes) if n.kind != "head" and n.end == end), None)
    if first is None:
        return f"start {start} falls inside an existing checkpoint"
    if last is None:
        return f"end {end} falls inside an existing checkpoint"
    balanced = balanced_cuts([n.message for n in nodes])
    if not balanced[first]:
        return f"start {start} would separate a tool result from the call before it"
    if not balanced[last + 1]:
        return f"end {end} would separate a tool call from its result after it"
    if first == last and nodes[first].kind == "checkpoint":
        return "the region is a single checkpoint already"
    return Span(first, last, start, end, _tokens(nodes, first, last + 1))
