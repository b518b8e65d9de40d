"""The cost bench's bill (``tests.bench.caching``): every unit lands in exactly one of new
tokens, rewrites, cache reads and summary calls, and each where it belongs."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.caching import Bill, BreakpointCache, PrefixCache
from tests.builders import assistant, user

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st


def message(index: int) -> dict[str, Any]:
    return user(f"message {index} " + "word " * 40)


def spend_total(bill: Bill) -> float:
    spend = bill.spend
    return spend.new + spend.rewrites + spend.reads + spend.summaries


def test_a_grown_prompt_reads_its_prefix_and_writes_only_what_is_new() -> None:
    cache, bill, grown = PrefixCache(FakeUpstream()), Bill(), Bill()
    cache.send("c", [message(0), message(1)], bill)
    cache.send("c", [message(0), message(1), message(2)], grown)
    assert bill.spend.reads == 0 and bill.spend.rewrites == 0 and bill.spend.new > 0
    assert grown.spend.rewrites == 0
    assert grown.spend.reads == pytest.approx(bill.prompt * 0.1)
    assert grown.spend.new == pytest.approx((grown.prompt - bill.prompt) * 1.25)


def test_what_follows_a_changed_message_is_a_rewrite_and_the_change_is_new() -> None:
    cache, changed = PrefixCache(FakeUpstream()), Bill()
    cache.send("c", [message(0), message(1), message(2)], Bill())
    cache.send("c", [message(0), user("a placeholder"), message(2)], changed)
    prices = FakeUpstream()
    assert changed.spend.reads == pytest.approx(
        prices.prompt_tokens({"messages": [message(0)]}) * 0.1
    )
    assert changed.spend.rewrites == pytest.approx(
        prices.prompt_tokens({"messages": [message(2)]}) * 1.25
    )
    assert changed.spend.new == pytest.approx(
        prices.prompt_tokens({"messages": [user("a placeholder")]}) * 1.25
    )


def test_a_summary_call_is_counted_whole_as_summaries() -> None:
    cache, call = PrefixCache(FakeUpstream()), Bill()
    cache.send("c", [message(0), message(1)], Bill())
    cache.send("c", [message(0), message(1), user("Summarize.")], call)
    call.as_summary_call(output=50)
    assert call.spend.new == call.spend.reads == call.spend.rewrites == 0
    assert call.spend.summaries == pytest.approx(call.units)


@given(st.lists(st.lists(st.integers(0, 6), max_size=6), min_size=1, max_size=8))
def test_the_split_of_prefix_bills_adds_up_to_the_bill(prompts: list[list[int]]) -> None:
    cache, whole = PrefixCache(FakeUpstream()), Bill()
    for indexes in prompts:
        bill = Bill()
        cache.send("c", [message(i) for i in indexes], bill)
        whole.add(bill)
    assert spend_total(whole) == pytest.approx(whole.units)


@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=6), min_size=1, max_size=8))
def test_the_split_of_breakpoint_bills_adds_up_to_the_bill(prompts: list[list[int]]) -> None:
    cache, whole = BreakpointCache(FakeUpstream()), Bill()
    for indexes in prompts:
        turns = [
            {"role": "user", "content": [{"type": "text", "text": f"block {i}"}]} for i in indexes
        ]
        turns[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        body = {"system": "You are terse.", "messages": [*turns, assistant("ok")]}
        bill = Bill()
        cache.send("c", body, bill)
        whole.add(bill)
    assert spend_total(whole) == pytest.approx(whole.units)
