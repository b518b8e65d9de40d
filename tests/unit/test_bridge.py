"""The bridge's cuts: oldest observations first, the fewest that save what is needed, never
at or past the retained tail, from the message as the client sent it; inputs untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compaction_proxy.compaction.bridge import bridge_cuts
from compaction_proxy.compaction.model_policy import bridge_pruner
from compaction_proxy.compaction.prune import MARKER, Pruner, prune_content
from compaction_proxy.config.settings import PrunerPolicy
from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.surface import SurfaceNode
from compaction_proxy.metering.anchor import Anchor
from tests.builders import assistant, tool, user

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

BRIDGE = Pruner(threshold_chars=40, head_chars=6, tail_chars=4)


def chars(message: Message) -> int:
    """A message's price: its content's length (any monotone price would do)."""
    return len(message.get("content") or "")


def body_nodes(body: list[Message]) -> list[SurfaceNode]:
    return [SurfaceNode(m, "body", i, i) for i, m in enumerate(body)]


def outputs(*lengths: int) -> list[Message]:
    return [tool(f"call_{i}", chr(ord("a") + i) * n) for i, n in enumerate(lengths)]


def positions(cuts: Any) -> list[int]:
    assert cuts is not None
    return [c.position for c in cuts.cuts]


LONG = 400
SAVED = LONG - (6 + 4 + len(MARKER.format(removed=LONG - 10)))  # by one cut of a LONG output


@pytest.mark.parametrize(("need", "expected"), [(1, [0]), (SAVED + 1, [0, 1]), (2 * SAVED, [0, 1])])
def test_the_fewest_cuts_oldest_first_that_save_what_is_needed(
    need: int, expected: list[int]
) -> None:
    body = outputs(LONG, LONG, LONG, LONG)
    cuts = bridge_cuts(body_nodes(body), body, 4, BRIDGE, chars, need)
    assert positions(cuts) == expected
    assert cuts is not None and cuts.saved == SAVED * len(expected)


def test_no_cut_when_all_of_them_together_save_too_little() -> None:
    body = outputs(LONG, LONG)
    assert bridge_cuts(body_nodes(body), body, 2, BRIDGE, chars, 2 * SAVED + 1) is None


def test_nothing_at_or_after_the_retained_tail_is_cut() -> None:
    body = outputs(LONG, LONG, LONG)
    assert positions(bridge_cuts(body_nodes(body), body, 1, BRIDGE, chars, 1)) == [0]
    assert bridge_cuts(body_nodes(body), body, 0, BRIDGE, chars, 1) is None


def test_only_observations_long_enough_are_cut() -> None:
    body: list[Message] = [
        user("the task"),
        assistant("x" * LONG),  # the model's own words: never an observation
        tool("call_0", "short"),  # under the bridge's threshold
        user("p" * LONG),  # a person's words after a tool result: never cut
        assistant("```bash\nls\n```"),
        # An observation: agents without tool calls return their outputs as user messages.
        user("<returncode>0</returncode>\n<output>\n" + "u" * LONG),
        tool("call_1", "t" * LONG),
    ]
    assert positions(bridge_cuts(body_nodes(body), body, 7, BRIDGE, chars, 1)) == [5]
    no_users = Pruner(threshold_chars=40, head_chars=6, tail_chars=4, user_messages=False)
    assert positions(bridge_cuts(body_nodes(body), body, 7, no_users, chars, 1)) == [6]


def test_head_and_checkpoint_nodes_are_never_cut() -> None:
    body = outputs(LONG, LONG, LONG)
    nodes = [
        SurfaceNode({"role": "system", "content": "s" * LONG}, "head"),
        SurfaceNode({"role": "user", "content": "c" * LONG}, "checkpoint", 0, 1),
        SurfaceNode(body[2], "body", 2, 2),
    ]
    assert positions(bridge_cuts(nodes, body, 3, BRIDGE, chars, 1)) == [2]


def test_a_pruned_node_is_cut_again_from_the_message_as_sent() -> None:
    """The saving counts from the pruned node; the cut is made on the client's message."""
    body = outputs(2 * LONG)
    pruned = SurfaceNode({**body[0], "content": "a" * LONG}, "pruned", 0, 0)
    cuts = bridge_cuts([pruned], body, 1, BRIDGE, chars, 1)
    assert cuts is not None and positions(cuts) == [0]
    kept = cuts.cuts[0].pruned
    assert kept.chars_before == 2 * LONG and kept.content.startswith("a" * 6)
    assert cuts.saved == LONG - kept.chars_after


def test_inputs_are_never_mutated() -> None:
    body = outputs(LONG, LONG)
    nodes = body_nodes(body)
    before = copy.deepcopy((body, nodes))
    bridge_cuts(nodes, body, 2, BRIDGE, chars, 1_000)
    bridge_cuts(nodes, body, 2, BRIDGE, chars, 1)
    assert (body, nodes) == before


def test_the_bridge_cuts_twice_what_it_keeps_or_is_off() -> None:
    pruner = bridge_pruner(PrunerPolicy(bridge_head_chars=1_000, bridge_tail_chars=200))
    assert pruner is not None
    assert (pruner.threshold_chars, pruner.head_chars, pruner.tail_chars) == (2_400, 1_000, 200)
    assert bridge_pruner(PrunerPolicy(bridge=False)) is None


@given(
    lengths=st.lists(st.integers(0, 600), max_size=10),
    before=st.integers(0, 10),
    needs=st.tuples(st.integers(1, 3_000), st.integers(1, 3_000)).map(sorted),
)
def test_cuts_are_the_oldest_eligible_observations_and_no_more_than_needed(
    lengths: list[int], before: int, needs: list[int]
) -> None:
    body = outputs(*lengths)
    smaller, larger = (bridge_cuts(body_nodes(body), body, before, BRIDGE, chars, n) for n in needs)
    if larger is not None:
        assert smaller is not None, "what saves more also saves less"
        assert larger.cuts[: len(smaller.cuts)] == smaller.cuts, "more need only cuts newer"
    for cuts, need in ((smaller, needs[0]), (larger, needs[1])):
        if cuts is None:
            continue
        saving = [lengths[c.position] - c.pruned.chars_after for c in cuts.cuts]
        assert all(s > 0 for s in saving) and cuts.saved == sum(saving) >= need
        assert cuts.saved - saving[-1] < need, "the last cut was needed"
        cut = [c.position for c in cuts.cuts]
        assert cut == sorted(cut) and cut[-1] < before
        for skipped in set(range(cut[-1])) - set(cut):  # oldest first: only what saves nothing
            kept = prune_content(body[skipped]["content"], BRIDGE)
            assert kept is None or kept.chars_after >= lengths[skipped]


@pytest.mark.parametrize(
    ("chain", "answered"),
    [
        (["c0", "c1", "c2"], True),  # the body the upstream answered
        (["c0", "c1", "c2", "c3"], True),  # one that extends it
        (["c0", "x1", "y2", "c3"], False),  # an early message rewritten: a new history
        (["c0", "c1"], False),  # shorter
    ],
)
def test_an_anchor_tells_a_body_extending_the_answered_one(
    chain: list[str], answered: bool
) -> None:
    anchor = Anchor("key", 2, 1_000, 990, tip_hash="c2")
    assert anchor.answered(chain) is answered
    assert not Anchor("key", 2, 1_000, 990).answered(chain), "stored before tips were kept"


def test_the_task_is_never_cut_even_when_the_bridge_needs_more() -> None:
    body = [user("t" * LONG), assistant("on it"), *outputs(LONG)]
    cuts = bridge_cuts(body_nodes(body), body, len(body), BRIDGE, chars, 2 * SAVED)
    assert cuts is None  # the task alone could have saved it: it is not offered
    assert positions(bridge_cuts(body_nodes(body), body, len(body), BRIDGE, chars, 1)) == [2]
