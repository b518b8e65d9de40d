"""Range selection: head never selected, retain from the tail, pairing balanced at the cut."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction.range_selection import (
    PricedNode,
    Span,
    balanced_cuts,
    call_pairs,
    first_node_at,
    retained_node,
    select_span,
)
from tests.builders import assistant, system, tool, user


def priced(messages: list[dict[str, Any]], tokens: list[int] | int = 10) -> list[PricedNode]:
    prices = tokens if isinstance(tokens, list) else [tokens] * len(messages)
    nodes: list[PricedNode] = []
    position = 0
    for message, price in zip(messages, prices, strict=True):
        if message["role"] == "system":
            nodes.append(PricedNode(message, price, "head"))
        else:
            kind = "checkpoint" if "compacted-summary" in str(message.get("content")) else "body"
            nodes.append(PricedNode(message, price, kind, position, position))
            position += 1
    return nodes


def call(cid: str) -> dict[str, Any]:
    return assistant(None, (cid, "bash", "{}"))


CONVERSATION = [
    system(),  # 0 head
    user("task"),  # 1
    call("a"),  # 2
    tool("a", "out"),  # 3
    call("b"),  # 4
    tool("b", "out"),  # 5
    assistant("done"),  # 6
    user("more"),  # 7
]


@pytest.mark.parametrize(
    ("cut", "balanced"),
    [
        (0, True),
        (1, True),
        (2, True),
        (3, False),
        (4, True),
        (5, False),
        (6, True),
        (7, True),
        (8, True),
    ],
)
def test_pairing_at_every_possible_cut(cut: int, balanced: bool) -> None:
    assert balanced_cuts(CONVERSATION)[cut] is balanced


def test_parallel_tool_calls_in_one_message_forbid_cuts_between_their_results() -> None:
    messages = [
        user("go"),
        assistant(None, ("x", "f", "{}"), ("y", "g", "{}")),
        tool("x", "1"),
        tool("y", "2"),
        user("next"),
    ]
    assert balanced_cuts(messages) == [True, True, False, False, True, True]


@pytest.mark.parametrize(
    ("retain", "expected"),
    [
        (0, (1, 6)),  # keep only the last node
        (10, (1, 6)),
        (20, (1, 5)),  # keeping 6..7 is fine
        (30, (1, 3)),  # keeping 5..7 would split b's call from its result: cut moves to 4
        (40, (1, 3)),
        (50, (1, 1)),  # 3..7 splits a's pair: cut moves to 2
        (60, (1, 1)),
    ],
)
def test_retain_budget_then_balanced_cut(retain: int, expected: tuple[int, int]) -> None:
    span = select_span(priced(CONVERSATION), retain)
    assert span is not None
    assert (span.first, span.last) == expected
    assert (span.start, span.end) == (expected[0] - 1, expected[1] - 1)


def test_retain_larger_than_the_conversation_selects_nothing() -> None:
    assert select_span(priced(CONVERSATION), 10_000) is None


def test_head_is_never_selected_and_last_node_always_kept() -> None:
    span = select_span(priced(CONVERSATION), 0)
    assert span is not None
    assert span.first == 1
    assert span.last == len(CONVERSATION) - 2


def test_a_single_body_node_gives_no_span() -> None:
    assert select_span(priced([system(), user("only")]), 0) is None


def test_a_lone_prior_checkpoint_is_not_summarized_again() -> None:
    messages = [system(), user("<compacted-summary>s</compacted-summary>"), user("next")]
    assert select_span(priced(messages), 0) is None


def test_a_prior_checkpoint_at_the_start_is_merged_into_the_span() -> None:
    messages = [
        system(),
        user("<compacted-summary>s</compacted-summary>"),
        call("a"),
        tool("a", "x"),
        user("next"),
    ]
    span = select_span(priced(messages), 0)
    assert span == Span(first=1, last=3, start=0, end=2, tokens=30)


def test_span_is_cut_to_fit_the_summary_call() -> None:
    span = select_span(priced(CONVERSATION), 0, summary_budget=35)
    assert span is not None
    assert (span.first, span.last, span.tokens) == (1, 3, 30)
    assert span.limited_by_fit


def test_a_single_huge_node_that_does_not_fit_gives_no_span() -> None:
    messages = [system(), user("huge"), assistant("ok"), user("next")]
    assert select_span(priced(messages, [5, 10_000, 10, 10]), 0, summary_budget=500) is None


def test_a_single_huge_node_alone_is_selected_when_it_fits() -> None:
    messages = [system(), user("huge"), assistant("ok"), user("next")]
    span = select_span(priced(messages, [5, 400, 10, 10]), 20, summary_budget=500)
    assert span is not None
    assert (span.first, span.last, span.tokens) == (1, 1, 400)


def test_a_node_cut_inside_the_summary_call_is_priced_as_cut() -> None:
    messages = [system(), user("huge"), assistant("ok"), user("next")]
    nodes = priced(messages, [5, 10_000, 10, 10])
    span = select_span(nodes, 0, summary_budget=500, call_tokens=[5, 250, 10, 10])
    assert span is not None
    assert (span.first, span.last, span.tokens) == (1, 2, 10_010)  # shadows the whole node


# -- positional pairing --------------------------------------------------------------------

REUSED = [
    user("task"),  # 0
    call("call_0"),  # 1
    tool("call_0", "one"),  # 2
    call("call_0"),  # 3
    tool("call_0", "two"),  # 4
    user("next"),  # 5
]


def test_reused_ids_pair_each_result_with_the_nearest_earlier_call() -> None:
    assert call_pairs(REUSED) == [(1, 2), (3, 4)]
    assert balanced_cuts(REUSED) == [True, True, False, True, False, True, True]


def test_empty_and_missing_ids_pair_with_the_nearest_call() -> None:
    messages = [
        user("task"),
        call(""),
        {"role": "tool", "tool_call_id": "", "content": "a"},
        assistant(None, ("", "f", "{}"), ("", "g", "{}")),
        {"role": "tool", "tool_call_id": "", "content": "b"},
        {"role": "tool", "content": "c"},
    ]
    assert call_pairs(messages) == [(1, 2), (3, 4), (3, 5)]
    assert balanced_cuts(messages) == [True, True, False, True, False, False, True]


def test_legacy_function_results_stay_with_their_function_call() -> None:
    messages = [
        user("task"),
        {"role": "assistant", "content": None, "function_call": {"name": "ls", "arguments": "{}"}},
        {"role": "function", "name": "ls", "content": "a b"},
        user("next"),
    ]
    assert balanced_cuts(messages) == [True, True, False, True, True]


def test_a_cut_with_reused_ids_never_orphans_a_result() -> None:
    nodes = priced([system(), *REUSED])
    for retain in range(0, 70, 5):
        span = select_span(nodes, retain)
        if span is not None:
            kept = [n.message for n in nodes[span.last + 1 :]]
            assert kept[0]["role"] != "tool", f"retain {retain} orphans a result"


# -- the live turn -------------------------------------------------------------------------


def test_the_live_turn_is_never_selected() -> None:
    messages = [
        system(),
        user("task"),
        assistant("run ls"),
        user("observation one"),  # the live turn: everything after the last answer
        user("observation two"),
    ]
    span = select_span(priced(messages), 0, live_from=3)
    assert span is not None
    assert (span.first, span.last) == (1, 2)


def test_a_body_that_is_all_live_turn_gives_no_span() -> None:
    messages = [system(), user("task"), user("more")]
    assert select_span(priced(messages), 0, live_from=1) is None


def test_the_retained_node_walks_back_from_the_live_turn() -> None:
    nodes = priced(CONVERSATION)
    assert retained_node(nodes, 0, 7) == 7
    assert retained_node(nodes, 25, 7) == 6
    assert retained_node(nodes, 10_000, 7) == 1  # never the head
    assert first_node_at(nodes, 3) == 4
    assert first_node_at(nodes, 99) == len(nodes)
