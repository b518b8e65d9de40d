"""Sizing the summary call: the summary's cap, the span budget, oversized messages cut."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction.fit import (
    MIN_SUMMARIZED_TOKENS,
    clip_for_call,
    clipped_span,
    summary_budget,
    summary_cap,
)
from compaction_proxy.conversation.text import text_of
from tests.builders import tool, user

FIXED = 1_500  # head, tools and instruction


@pytest.mark.parametrize(
    ("window", "cap", "span"),
    [
        (8_000, 2_000, 4_260),  # a quarter of the window, not the policy's 8192
        (16_000, 4_000, 10_020),
        (128_000, 8_192, 114_468),  # the policy's cap once the window is large
    ],
)
def test_the_summary_cap_is_a_quarter_of_the_window_at_most(
    window: int, cap: int, span: int
) -> None:
    budget = summary_budget(8_192, FIXED, window, window)
    assert (budget.cap, budget.span) == (cap, span)
    assert budget.per_message == span // 2
    assert FIXED + budget.span + budget.cap <= window


def test_the_summary_call_is_sized_to_the_summary_models_window() -> None:
    # A 128k request model summarized by an 8k model: the call fits the 8k model.
    budget = summary_budget(8_192, FIXED, 8_000, 128_000)
    assert budget.cap == 2_000
    assert budget.span is not None and FIXED + budget.span + budget.cap <= 8_000
    # And a summary can never take more than a quarter of the request's own window.
    assert summary_budget(8_192, FIXED, 128_000, 16_000).cap == 4_000


def test_without_a_known_window_only_the_cap_applies() -> None:
    assert summary_budget(8_192, FIXED, None, None).span is None
    assert summary_budget(8_192, FIXED, None, 16_000).cap == 4_000


def test_a_head_that_fills_the_window_leaves_no_span() -> None:
    budget = summary_budget(8_192, 7_900, 8_000, 8_000)
    assert budget.span is not None and budget.span <= 0
    assert budget.per_message is None


def price(message: dict[str, Any]) -> int:
    """One token per four characters, like English text."""
    return len(text_of(message.get("content")) or "") // 4


def test_an_oversized_message_is_cut_to_head_and_tail_inside_the_call() -> None:
    message = tool("c1", "HEAD" + "x" * 40_000 + "TAIL")
    clipped, tokens = clip_for_call(message, price(message), 1_000, price)
    assert tokens <= 1_000
    text = clipped["content"]
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert "characters removed by compaction-proxy" in text
    assert clipped["tool_call_id"] == "c1"
    assert message["content"].endswith("TAIL") and len(message["content"]) == 40_008


def test_a_message_within_the_limit_or_without_text_is_left_alone() -> None:
    small = user("short")
    assert clip_for_call(small, 2, 1_000, price) == (small, 2)
    calls_only = {"role": "assistant", "content": None, "tool_calls": []}
    assert clip_for_call(calls_only, 5_000, 1_000, price) == (calls_only, 5_000)


def test_only_clippable_messages_are_cut() -> None:
    big = user("y" * 8_000)
    carried, prices = clipped_span([big, big], [2_000, 2_000], [False, True], 500, price)
    assert carried[0] is big and prices[0] == 2_000
    assert prices[1] <= 500


@pytest.mark.parametrize(
    ("budget_cap", "span_tokens", "cap"),
    [
        # Seen: a conversation switching from gpt-4o to gpt-3.5-turbo at 14k tokens, whose
        # only span was one 8-token user message.
        (2_000, 8, None),
        # Seen: Codex's first request, an 8.7k-token head, over its environment context and
        # prompt, with max_tokens 153.
        (153, 310, None),
        (2_000, 999, None),
        (8_192, 1_000, 500),  # at least half the span saved
        (2_000, 3_000, 1_500),
        (2_000, 40_000, 2_000),  # the budget's cap when the span is large
    ],
)
def test_a_span_is_summarized_only_when_the_summary_can_pay_for_its_call(
    budget_cap: int, span_tokens: int, cap: int | None
) -> None:
    given = summary_cap(budget_cap, span_tokens)
    assert given == cap
    assert given is None or (span_tokens >= 2 * given and span_tokens >= MIN_SUMMARIZED_TOKENS)
