"""Dropped turns, the last resort of model-free relief: the fewest oldest agent turns after
the task, whole and paired, never the head, the task, a checkpoint, the live turn or a
person's words."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction.drop_turns import drop_marker, turns_to_drop
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.range_selection import PricedNode, balanced_cuts
from compaction_proxy.conversation.messages import Message, task_position
from tests.builders import assistant, system, tool, user

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

PRUNER = Pruner()
MARKER = 5  # the marker's price in these tables


def priced(head: list[Message], body: list[Message], price: int = 10) -> list[PricedNode]:
    return [PricedNode(m, price, "head") for m in head] + [
        PricedNode(m, price, "body", i, i) for i, m in enumerate(body)
    ]


def droppable(body: list[Message]) -> Any:
    task = task_position(body)

    def may(position: int) -> bool:
        role = body[position].get("role")
        if role in ("assistant", "tool"):
            return True
        return role == "user" and PRUNER.may_cut(body, position, task)

    return may


def agent_body(turns: int) -> list[Message]:
    """The task, ``turns`` call/result pairs, and a live turn."""
    body = [user("Fix the importer.")]
    for i in range(turns):
        body += [assistant(None, (f"call_{i}", "bash", "{}")), tool(f"call_{i}", f"out {i}")]
    return [*body, assistant("Looking."), user("Go on.")]


def drop(head: list[Message], body: list[Message], need: int) -> Any:
    nodes = priced(head, body)
    live = len(nodes) - 1  # the last user message: the live turn
    task = task_position(body)
    return turns_to_drop(nodes, task, live, droppable(body), lambda t, m: MARKER, need)


@pytest.mark.parametrize(
    ("need", "turns", "end"),
    [(1, 1, 2), (15, 1, 2), (16, 2, 4), (35, 2, 4), (36, 3, 6)],
)
def test_the_fewest_oldest_whole_turns_after_the_task_that_save_what_is_needed(
    need: int, turns: int, end: int
) -> None:
    body = agent_body(6)
    dropped = drop([system()], body, need)
    assert dropped is not None
    assert (dropped.start, dropped.end, dropped.turns) == (1, end, turns)
    assert dropped.saved == 20 * turns - MARKER >= need


def test_a_span_never_parts_a_result_from_its_call() -> None:
    body = agent_body(4)
    balanced = balanced_cuts(body)
    for need in range(1, 80):
        dropped = drop([], body, need)
        if dropped is not None:
            assert balanced[dropped.start] and balanced[dropped.end + 1]


def test_nothing_is_dropped_when_even_every_turn_saves_too_little() -> None:
    body = agent_body(3)
    assert drop([system()], body, 3 * 20 + 10) is None


def test_a_persons_message_stops_the_span() -> None:
    body = agent_body(2)
    body = [*body[:3], user("Also keep the old CSV format, please."), *body[3:]]
    assert drop([], body, 10) is not None  # the first turn may go
    assert drop([], body, 30) is None  # the next would take the person's words with it


def test_observation_style_user_messages_go_with_their_turn() -> None:
    """mini-SWE-agent answers each command with a user message: an observation, not a
    person's words; the turn goes whole."""
    body = [user("Fix the importer.")]
    for i in range(3):
        body += [
            assistant(f"THOUGHT {i}\n```bash\nls\n```"),
            user(f"<returncode>0</returncode> {i}"),
        ]
    body += [assistant("Looking."), user("<returncode>0</returncode> live")]
    dropped = drop([], body, 30)
    assert dropped is not None and (dropped.start, dropped.end, dropped.turns) == (1, 4, 2)


def test_the_task_and_a_checkpoint_stay_the_span_starts_after_them() -> None:
    body = agent_body(4)
    nodes = [
        PricedNode(body[0], 10, "body", 0, 0),
        PricedNode(user("<summary>"), 10, "checkpoint", 1, 2),
        *(PricedNode(m, 10, "body", i, i) for i, m in enumerate(body) if i > 2),
    ]
    dropped = turns_to_drop(nodes, 0, len(nodes) - 1, droppable(body), lambda t, m: 5, 1)
    assert dropped is not None and dropped.start == 3 and dropped.first == 2


def test_no_turn_before_the_live_one_means_nothing_to_drop() -> None:
    body = [user("Fix the importer."), assistant("Looking."), user("Go on.")]
    assert drop([system()], body, 1) is None


def test_the_marker_says_how_many_turns_went_and_that_a_summary_follows() -> None:
    text = drop_marker(3, 6)["content"]
    assert "3 earlier turns (6 messages)" in text and "summary" in text
    assert "1 earlier turn (" in drop_marker(1, 2)["content"]


@given(turns=st.integers(0, 12), need=st.integers(1, 300), person=st.integers(-1, 30))
def test_a_drop_keeps_head_task_live_turn_and_persons_words(
    turns: int, need: int, person: int
) -> None:
    body = agent_body(turns)
    if 1 <= person < len(body) - 2:
        body.insert(person, user("A person's remark."))
    head = [system()]
    dropped = drop(head, body, need)
    if dropped is None:
        return
    task = task_position(body)
    assert task is not None and dropped.start > task
    assert dropped.end < len(body) - 2  # the model's last answer and the live turn stay
    assert dropped.saved >= need and dropped.turns >= 1
    left_out = body[dropped.start : dropped.end + 1]
    assert all(m["content"] != "A person's remark." for m in left_out)
    balanced = balanced_cuts(body)
    assert balanced[dropped.start] and balanced[dropped.end + 1]
