"""Where records and leases sit on a chain (``store.branches``): pure tables."""

from __future__ import annotations

import pytest

from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.store.branches import (
    WHOLE_CONVERSATION,
    AnchoredRecords,
    anchor_of,
    generation_of,
    lease_anchor,
    on_chain,
    order_of,
)

CHAIN = ["h0", "h1", "h2", "h3"]


@pytest.mark.parametrize(
    ("chain", "position", "chain_hash", "holds"),
    [
        (CHAIN, 2, "h2", True),
        (CHAIN, 2, "other", False),  # a twin's anchor at the same position
        (CHAIN, 4, "h4", False),  # past the chain's end
        (CHAIN, -2, "h0", False),
        (CHAIN, WHOLE_CONVERSATION, "", True),  # a whole-conversation lease lies on every chain
        (None, 7, "anything", True),  # the whole conversation holds every anchor
    ],
)
def test_an_anchor_lies_on_a_chain_only_where_the_chain_holds_its_hash(
    chain: list[str] | None, position: int, chain_hash: str, holds: bool
) -> None:
    assert on_chain(chain, position, chain_hash) is holds


def test_records_are_anchored_where_they_end() -> None:
    message = {"role": "user", "content": "s"}
    assert anchor_of(Checkpoint(0, 2, "root", "h2", message, tokens=1)) == (2, "h2")
    assert anchor_of(Prune(3, "h3", "x")) == (3, "h3")


@pytest.mark.parametrize(
    ("chain", "at", "anchor"),
    [
        (CHAIN, 3, (3, "h3")),
        (CHAIN, 9, (WHOLE_CONVERSATION, "")),  # not on the chain: the lease covers everything
        (None, 1, (WHOLE_CONVERSATION, "")),
    ],
)
def test_a_lease_sits_at_its_compactions_end_or_covers_the_conversation(
    chain: list[str] | None, at: int, anchor: tuple[int, str]
) -> None:
    assert lease_anchor(chain, at) == anchor


def test_commit_order_keeps_the_generation_first() -> None:
    assert generation_of(order_of(7, 3)) == 7
    assert order_of(2, 65_535) < order_of(3, 0)
    with pytest.raises(ValueError, match="at most"):
        order_of(1, 1 << 16)


def test_unused_anchors_are_dropped_least_recently_used_first_and_sizes_follow() -> None:
    held = AnchoredRecords()
    a, b = Prune(1, "a1", "x"), Prune(1, "b1", "y")
    held.add([a], generation=1, now=10.0)
    held.add([b], generation=2, now=11.0)
    held.touch([a], now=12.0)  # a reached again: b is now the least recently used
    held.drop_unused(since=11.5)
    assert [p.record for p in held.on(None)] == [a]
    assert held.by_position == {1: {"a1"}}
    held.remove([a], generation=3)
    # The anchor stays, marked with the commit that dropped its record, until unused.
    assert (held.size, held.branch(["x0", "a1"])) == (0, ([], 3))
    held.drop_unused(since=13.0)
    assert (held.by_anchor, held.by_position, held.used, held.dropped_by) == ({}, {}, {}, {})
