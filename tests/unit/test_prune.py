"""The pruner: exact boundaries, code points not bytes, parts kept in order, inputs untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compaction_proxy.compaction.prune import MARKER, Pruner, prune_candidates, prune_content
from compaction_proxy.conversation.messages import task_position
from tests.builders import assistant, tool, user

SMALL = Pruner(threshold_chars=20, head_chars=6, tail_chars=4)


def marker(removed: int) -> str:
    return MARKER.format(removed=removed)


@pytest.mark.parametrize("length", [0, 1, 19, 20])
def test_content_within_the_threshold_is_untouched(length: int) -> None:
    assert prune_content("x" * length, SMALL) is None


def test_one_code_point_over_the_threshold_is_pruned() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(21))
    pruned = prune_content(text, SMALL)
    assert pruned is not None
    assert pruned.content == text[:6] + marker(11) + text[-4:]
    assert (pruned.chars_before, pruned.chars_after) == (21, 10 + len(marker(11)))


@pytest.mark.parametrize(
    ("text", "head", "tail"),
    [
        ("😀" * 30, "😀" * 6, "😀" * 4),  # emoji: one code point each
        ("漢字" * 15, "漢字漢字漢字", "漢字漢字"),  # CJK
        ("é" * 25, "é" * 6, "é" * 4),
    ],
)
def test_counts_code_points_not_bytes(text: str, head: str, tail: str) -> None:
    pruned = prune_content(text, SMALL)
    assert pruned is not None
    assert pruned.content == head + marker(len(text) - 10) + tail


def test_never_splits_a_surrogate_pair() -> None:
    pair = "\ud83d\ude00"  # one emoji as two UTF-16 code units
    text = "abcde" + pair + "x" * 20 + pair[0] * 0 + "yyy" + pair
    pruned = prune_content(text, SMALL)
    assert pruned is not None
    head, _, rest = pruned.content.partition("\n[...")
    tail = rest.rsplit("...]\n", 1)[1]
    assert head == "abcde"  # the cut moved back before the pair rather than through it
    assert tail == "yy" + pair
    assert pruned.content.count("\ud83d") == pruned.content.count("\ude00")


def test_content_list_keeps_non_text_parts_in_order() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    content = [
        {"type": "text", "text": "0123456789"},
        image,
        {"type": "text", "text": "abcdefghij"},
        {"type": "text", "text": "KLMNOPQRST"},
    ]
    pruned = prune_content(content, SMALL)
    assert pruned is not None
    assert pruned.content == [
        {"type": "text", "text": "012345" + marker(20)},
        image,
        {"type": "text", "text": "QRST"},
    ]
    assert pruned.chars_before == 30


def test_marker_states_how_many_code_points_were_removed() -> None:
    pruned = prune_content("z" * 9000, Pruner())
    assert pruned is not None
    assert "[... 3880 characters removed by compaction-proxy ...]" in pruned.content
    assert pruned.content.startswith("z" * 4096)
    assert pruned.content.endswith("z" * 1024)


OUTPUT = "<returncode>0</returncode>\n<output>\n"  # how mini-SWE-agent returns an output


def test_observations_in_any_role_are_pruned_and_inputs_never_change() -> None:
    messages: list[dict[str, Any]] = [
        user("u" * 50),
        tool("c1", "t" * 50),
        tool("c2", "short"),
        {"role": "tool", "tool_call_id": "c3", "content": None},
        {"role": "function", "name": "ls", "content": "f" * 50},
        {"role": "assistant", "content": "a" * 50},
        {"role": "user", "content": [{"type": "text", "text": OUTPUT + "p" * 50}]},
    ]
    before = copy.deepcopy(messages)
    candidates = prune_candidates([0, 1, 2, 3, 4, 5, 6], messages, SMALL, 0, messages)
    assert messages == before
    assert [c.position for c in candidates] == [1, 4, 6]
    assert candidates[0].pruned.chars_before == 50


def test_user_messages_are_observations_only_when_the_policy_says_so() -> None:
    tools_only = Pruner(threshold_chars=20, head_chars=6, tail_chars=4, user_messages=False)
    messages = [user("task"), tool("c1", "t" * 50), assistant("run"), user(OUTPUT + "u" * 50)]
    positions = [0, 1, 2, 3]
    assert [c.position for c in prune_candidates(positions, messages, tools_only, 0, messages)] == [
        1
    ]
    assert [c.position for c in prune_candidates(positions, messages, SMALL, 0, messages)] == [
        1,
        3,
    ]


@pytest.mark.parametrize(
    ("messages", "cut"),
    [
        # A person chatting, then pasting a contract: never cut.
        ([user("hi"), assistant("hello"), user("contract " * 20)], []),
        # An assistant that suggested commands does not make the reply an agent's output.
        ([user("how?"), assistant("```bash\nls\n```"), user("here is my file " * 9)], []),
        # A user message right after another user message is a person's.
        ([user("task"), user(OUTPUT + "x" * 50)], []),
        # Observation-style agents, by the markers they open outputs with.
        ([user("task"), assistant("```bash\nls\n```"), user(OUTPUT + "x" * 50)], [2]),
        ([user("task"), assistant("ls"), user("OBSERVATION:\n" + "x" * 50)], [2]),
        ([user("task"), assistant("ls"), user("EXECUTION RESULT of [bash]:\n" + "x" * 50)], [2]),
    ],
    ids=[
        "person-chatting",
        "commands-suggested",
        "no-assistant-before",
        "mini-swe-agent",
        "swe-agent",
        "openhands",
    ],
)
def test_a_user_message_is_cut_only_on_evidence_it_is_an_agents_output(
    messages: list[dict[str, Any]], cut: list[int]
) -> None:
    positions = list(range(len(messages)))
    found = prune_candidates(positions, messages, SMALL, task_position(messages), messages)
    assert [c.position for c in found] == cut


def test_a_checkpoint_is_never_pruned() -> None:
    checkpoint = tool("c1", "<compacted-summary>\n" + "s" * 50 + "\n</compacted-summary>")
    assert prune_candidates([0], [checkpoint], SMALL, None, [checkpoint]) == []


def test_the_cut_offsets_reproduce_the_pruned_content() -> None:
    from compaction_proxy.conversation.text import cut

    text = "0123456789" * 5
    pruned = prune_content(text, SMALL)
    assert pruned is not None
    assert cut(text, pruned.head_end, pruned.tail_start) == pruned.content


@pytest.mark.parametrize(
    ("threshold", "head", "tail"),
    [(10, 5, 5), (10, 8, 3), (0, 0, 0), (10, -1, 2)],
)
def test_invalid_pruner_settings_are_rejected(threshold: int, head: int, tail: int) -> None:
    with pytest.raises(ValueError):
        Pruner(threshold_chars=threshold, head_chars=head, tail_chars=tail)


def test_the_task_is_never_pruned_however_long_and_later_agent_outputs_are() -> None:
    messages = [user(OUTPUT + "task " * 30), assistant("ok"), user(OUTPUT + "more " * 30)]
    task = task_position(messages)
    candidates = prune_candidates([0, 1, 2], messages, SMALL, task, messages)
    assert [c.position for c in candidates] == [2]


def test_the_task_is_the_first_user_message_of_the_body() -> None:
    assert task_position([assistant("hello"), user("do this"), user("and this")]) == 1
    assert task_position([assistant("nothing asked")]) is None
