"""Range selection (pure): which leading span of the body to summarize.

Over the priced surface nodes: the head is never selected; walking back from the tail, nodes
are kept while they fit the ``retain`` budget (the live turn always: what the client sent
after the model's last answer); the cut then moves toward the head until no result after it
answers a call before it (pairing is positional, see ``call_pairs``). The span is everything
between the head and the cut. It must also fit the summary call (head + tools + span +
instruction + summary cap within the window); otherwise the largest balanced head span that
fits is taken, and the caller may run another round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_proxy.conversation.messages import Message
from compaction_proxy.frozen import frozen


@frozen
class PricedNode:
    message: Message
    tokens: int
    kind: str  # "head" | "body" | "pruned" | "checkpoint"
    start: int | None = None
    end: int | None = None


@frozen
class Span:
    """Surface nodes ``first..last`` (inclusive), standing for body ``start..end``."""

    first: int
    last: int
    start: int
    end: int
    tokens: int
    limited_by_fit: bool = False


def _call_ids(message: Message) -> list[str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [str(c.get("id") or "") for c in calls if isinstance(c, dict)]


def call_pairs(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """``(call, result)`` positions, paired by position rather than by id alone.

    Real clients reuse ids (``call_0`` every turn) or send empty ones, so a ``tool`` result
    belongs to the nearest earlier assistant message that made a call with its id; with no such
    call, to the nearest earlier assistant message with any tool calls. A legacy ``function``
    result belongs to the nearest earlier assistant ``function_call``.
    """
    pairs: list[tuple[int, int]] = []
    caller_of: dict[str, int] = {}
    last_caller: int | None = None
    last_function_caller: int | None = None
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            ids = _call_ids(message)
            for call_id in ids:
                caller_of[call_id] = index
            if ids:
                last_caller = index
            if isinstance(message.get("function_call"), dict):
                last_function_caller = index
        elif role == "tool":
            caller = caller_of.get(str(message.get("tool_call_id") or ""), last_caller)
            if caller is not None:
                pairs.append((caller, index))
        elif role == "function" and last_function_caller is not None:
            pairs.append((last_function_caller, index))
    return pairs


def balanced_cuts(messages: Sequence[Message]) -> list[bool]:
    """``result[i]``: cutting before message ``i`` separates no result from its call.

    ``result[len(messages)]`` is always True.
    """
    # A call at i answered at j forbids every cut in (i, j].
    forbidden = [0] * (len(messages) + 2)
    for call, result in call_pairs(messages):
        forbidden[call + 1] += 1
        forbidden[result + 1] -= 1
    balanced: list[bool] = []
    running = 0
    for index in range(len(messages) + 1):
        running += forbidden[index]
        balanced.append(running == 0)
    return balanced


def select_span(
    nodes: Sequence[PricedNode],
    retain: int,
    summary_budget: int | None = None,
    *,
    live_from: int | None = None,
    call_tokens: Sequence[int] | None = None,
) -> Span | None:
    """The span to summarize, or None when there is no useful one. Linear in the nodes.

    ``summary_budget``: the most span tokens the summary call can carry (window minus head,
    tools, instruction and summary cap); None when unbounded. ``live_from``: the node where the
    live turn starts; it and everything after it are never selected (default: the last node).
    ``call_tokens``: what each node costs inside the summary call, where oversized messages are
    cut; the node's own tokens when not given.
    """
    head = sum(1 for n in nodes if n.kind == "head")
    count = len(nodes)
    stop = count - 1 if live_from is None else min(live_from, count - 1)
    if stop <= head:
        return None
    balanced = balanced_cuts([n.message for n in nodes])

    cut = retained_node(nodes, retain, stop)  # the first kept node
    while cut > head and not balanced[cut]:
        cut -= 1

    limited = False
    if summary_budget is not None:
        fit = call_tokens if call_tokens is not None else [n.tokens for n in nodes]
        in_call = sum(fit[head:cut])
        while cut > head and (in_call > summary_budget or not balanced[cut]):
            cut -= 1
            in_call -= fit[cut]
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


def first_node_at(nodes: Sequence[PricedNode], position: int) -> int:
    """The index of the first non-head node standing for body ``position`` or later
    (``len(nodes)`` when there is none)."""
    for index, node in enumerate(nodes):
        if node.kind != "head" and node.start is not None and node.start >= position:
            return index
    return len(nodes)


def retained_node(nodes: Sequence[PricedNode], retain: int, stop: int) -> int:
    """The first node kept when nodes from ``stop`` on are always kept and earlier ones are
    kept, walking back, while they fit ``retain`` tokens with them. Never a head node."""
    head = sum(1 for n in nodes if n.kind == "head")
    cut = max(stop, head)
    kept = sum(n.tokens for n in nodes[cut:])
    while cut > head and kept + nodes[cut - 1].tokens <= retain:
        cut -= 1
        kept += nodes[cut].tokens
    return cut


def _tokens(nodes: Sequence[PricedNode], first: int, stop: int) -> int:
    return sum(n.tokens for n in nodes[first:stop])


def priced_nodes(surface_nodes: Sequence[Any], prices: Sequence[int]) -> list[PricedNode]:
    return [
        PricedNode(n.message, p, n.kind, n.start, n.end)
        for n, p in zip(surface_nodes, prices, strict=True)
    ]


def region_span(
    nodes: Sequence[PricedNode], body_length: int, start: int, end: int, live_start: int
) -> Span | str:
    """The span standing for body positions ``start..end`` (inclusive), or why there is none:
    out of range, inside the live turn (body positions from ``live_start`` on, always kept), a
    cut inside an existing checkpoint, or a cut that separates a tool result from its call."""
    if not 0 <= start <= end < body_length:
        return f"positions {start}..{end} are out of range (the body has {body_length} messages)"
    if end >= min(live_start, body_length - 1):
        return (
            "the live turn (what the client sent after the model's last answer) and the last "
            f"message are always kept: end must be before {min(live_start, body_length - 1)}"
        )
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
