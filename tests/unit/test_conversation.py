"""The pure conversation model: canonical hashing, chains, records and the surface."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.conversation import (
    Checkpoint,
    Prune,
    ReplacementRecord,
    Surface,
    canonical_message,
    chain_hashes,
    chain_root,
    conversation_id,
    derive_surface,
    is_valid_session_id,
    record_from_dict,
    record_to_dict,
    split_head,
)
from tests.builders import Message, agent_turns, assistant, system, tool, user

ROOT = chain_root("tenant-a")


def conversation(turns: int = 5) -> list[Message]:
    return [user("Fix the bug in parser.py"), *agent_turns(turns)]


def checkpoint_over(body: list[Message], start: int, end: int, text: str = "summary") -> Checkpoint:
    chain = chain_hashes(ROOT, body)
    return Checkpoint(
        start=start,
        end=end,
        start_prev_hash=ROOT if start == 0 else chain[start - 1],
        end_hash=chain[end],
        message=user(f"<compacted-summary>{text}</compacted-summary>"),
        tokens=10,
    )


def prune_at(body: list[Message], position: int, content: str = "[pruned]") -> Prune:
    return Prune(position=position, hash=chain_hashes(ROOT, body)[position], content=content)


def surface_of(
    body: list[Message], records: list[ReplacementRecord], head: list[Message] | None = None
) -> Surface:
    return derive_surface(head or [], body, chain_hashes(ROOT, body), ROOT, records)


# -- canonical messages and chains ---------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (assistant("hi"), {"role": "assistant", "content": "hi", "refusal": None}),
        (assistant("hi"), {"role": "assistant", "content": "hi", "annotations": []}),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "index": 0,
                        "function": {"arguments": "{}", "name": "f"},
                    }
                ],
            },
        ),
        (user("x"), {"content": "x", "role": "user", "name": ""}),
    ],
)
def test_reserialized_message_has_the_same_canonical_bytes(first: Message, second: Message) -> None:
    assert canonical_message(first) == canonical_message(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (user("x"), user("y")),
        (user("x"), assistant("x")),
        (tool("a", "out"), tool("b", "out")),
        (user("x"), {"role": "user", "content": "x", "name": "alice"}),
        (user("x"), {"role": "user", "content": [{"type": "text", "text": "x"}]}),
    ],
)
def test_semantically_different_messages_differ(first: Message, second: Message) -> None:
    assert canonical_message(first) != canonical_message(second)


def test_chain_hash_names_the_whole_prefix() -> None:
    body = conversation()
    edited = copy.deepcopy(body)
    edited[2]["content"] = "edited"
    a, b = chain_hashes(ROOT, body), chain_hashes(ROOT, edited)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))


def test_chains_of_two_tenants_never_meet() -> None:
    body = conversation()
    other = chain_hashes(chain_root("tenant-b"), body)
    assert not set(chain_hashes(ROOT, body)) & set(other)


def test_head_is_the_leading_system_and_developer_run() -> None:
    messages = [system(), {"role": "developer", "content": "d"}, user("u"), system("late")]
    head, body = split_head(messages)
    assert head == messages[:2]
    assert body == messages[2:]


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("abc-123_x.y:z", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        ("has space", False),
        ("slash/no", False),
        ("ünicode", False),
    ],
)
def test_session_id_validation(value: str, valid: bool) -> None:
    assert is_valid_session_id(value) is valid


def test_conversation_id_from_header_is_namespaced_by_tenant() -> None:
    chain = chain_hashes(ROOT, conversation())
    a = conversation_id("tenant-a", ROOT, chain, "run-1")
    b = conversation_id("tenant-b", chain_root("tenant-b"), chain, "run-1")
    assert a != b
    assert a == conversation_id("tenant-a", ROOT, chain[:1], "run-1")


def test_conversation_id_without_header_follows_the_first_message() -> None:
    body = conversation()
    longer = chain_hashes(ROOT, [*body, user("more")])
    assert conversation_id("tenant-a", ROOT, chain_hashes(ROOT, body), None) == conversation_id(
        "tenant-a", ROOT, longer, None
    )


@pytest.mark.parametrize(
    "record",
    [
        Checkpoint(0, 3, "aa", "bb", user("s"), tokens=5, shadowed_tokens=50),
        Prune(4, "cc", [{"type": "text", "text": "x"}], chars_before=10, chars_after=2),
    ],
)
def test_records_round_trip_through_plain_dicts(record: ReplacementRecord) -> None:
    assert record_from_dict(record_to_dict(record)) == record


# -- surface derivation --------------------------------------------------------------------


def test_no_records_gives_the_request_itself() -> None:
    head, body = [system()], conversation()
    surface = surface_of(body, [], head)
    assert surface.messages == head + body
    assert not surface.changed


def test_checkpoint_applies_to_a_request_that_extends_its_prefix() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 4)
    later = [*body, user("next question")]
    surface = surface_of(later, [record], [system()])
    assert surface.messages == [system(), record.message, *later[5:]]
    assert surface.checkpoints == (record,)
    assert [(n.kind, n.start, n.end) for n in surface.nodes[:3]] == [
        ("head", None, None),
        ("checkpoint", 0, 4),
        ("body", 5, 5),
    ]


def test_changed_system_prompt_keeps_the_checkpoint() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 4)
    surface = surface_of(body, [record], [system("a rewritten system prompt, turn 7")])
    assert surface.messages[:2] == [system("a rewritten system prompt, turn 7"), record.message]


def test_fork_before_the_checkpoint_end_does_not_receive_it() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 6)
    fork = [*body[:4], user("a different direction"), *agent_turns(2, output="fork")]
    assert surface_of(fork, [record]).messages == fork


def test_edit_inside_the_checkpoint_span_drops_it() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 6)
    edited = copy.deepcopy(body)
    edited[3]["content"] = "tool output, edited by the client"
    assert surface_of(edited, [record]).messages == edited


def test_edit_after_the_checkpoint_keeps_it() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 4)
    edited = copy.deepcopy(body)
    edited[7]["content"] = "edited after the span"
    surface = surface_of(edited, [record])
    assert surface.messages == [record.message, *edited[5:]]


def test_regeneration_keeps_the_checkpoint_and_drops_the_old_answer() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 4)
    first = [*body, assistant("first answer")]
    regenerated = [*body, assistant("second answer")]
    assert surface_of(first, [record]).messages[-1] == assistant("first answer")
    assert surface_of(regenerated, [record]).messages[-1] == assistant("second answer")


def test_checkpoint_never_covers_the_last_body_message() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, len(body) - 1)
    assert surface_of(body, [record]).messages == body
    assert surface_of([*body, user("next")], [record]).messages == [record.message, user("next")]


def test_checkpoint_of_another_tenant_never_applies() -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 4)
    other_root = chain_root("tenant-b")
    other = derive_surface([], body, chain_hashes(other_root, body), other_root, [record])
    assert other.messages == body


def test_deepest_checkpoint_wins_and_overlapping_ones_are_skipped() -> None:
    body = conversation(6)
    shallow = checkpoint_over(body, 0, 4, "shallow")
    deep = checkpoint_over(body, 0, 8, "deep")
    overlapping = checkpoint_over(body, 3, 6, "overlap")
    surface = surface_of(body, [shallow, overlapping, deep])
    assert surface.checkpoints == (deep,)
    assert surface.messages == [deep.message, *body[9:]]


def test_disjoint_checkpoints_both_apply() -> None:
    body = conversation(6)
    first = checkpoint_over(body, 0, 2, "first")
    region = checkpoint_over(body, 5, 8, "region")
    surface = surface_of(body, [first, region])
    assert surface.messages == [first.message, *body[3:5], region.message, *body[9:]]


def test_region_checkpoint_needs_the_prefix_before_its_start() -> None:
    body = conversation(6)
    region = checkpoint_over(body, 5, 8)
    edited = copy.deepcopy(body)
    edited[1]["tool_calls"][0]["function"]["arguments"] = '{"command": "other"}'
    assert surface_of(edited, [region]).messages == edited


def test_prune_replaces_only_the_content() -> None:
    body = conversation()
    record = prune_at(body, 2, "head [... 900 characters removed ...] tail")
    surface = surface_of(body, [record])
    assert surface.messages[2] == {**body[2], "content": record.content}
    assert surface.messages[:2] == body[:2]
    assert surface.prunes == (record,)


def test_prune_inside_a_checkpoint_is_not_applied() -> None:
    body = conversation()
    prune = prune_at(body, 2)
    record = checkpoint_over(body, 0, 4)
    surface = surface_of(body, [prune, record])
    assert surface.prunes == ()
    assert surface.messages == [record.message, *body[5:]]


def test_prune_after_an_edited_prefix_does_not_apply() -> None:
    body = conversation()
    prune = prune_at(body, 4)
    edited = copy.deepcopy(body)
    edited[0]["content"] = "another task"
    assert surface_of(edited, [prune]).messages == edited


def test_first_committed_prune_wins_at_one_position() -> None:
    body = conversation()
    first, second = prune_at(body, 2, "first"), prune_at(body, 2, "second")
    assert surface_of(body, [first, second]).messages[2]["content"] == "first"


def test_derivation_never_mutates_its_input() -> None:
    head, body = [system()], conversation()
    records: list[Any] = [checkpoint_over(body, 0, 2), prune_at(body, 6)]
    before = copy.deepcopy((head, body, records))
    surface_of(body, records, head)
    assert (head, body, records) == before


@pytest.mark.parametrize(
    ("edit_at", "extra", "missed"),
    [
        (None, 1, False),  # the checkpoint applies
        (0, 1, True),  # early message rewritten: long enough, shares no prefix
        (7, 1, False),  # edited after the span: the checkpoint still applies
        (0, -6, False),  # too short to have used the checkpoint anyway
    ],
)
def test_missed_checkpoints(edit_at: int | None, extra: int, missed: bool) -> None:
    from proxy.conversation import missed_checkpoints

    body = conversation()
    record = checkpoint_over(body, 0, 4)
    request = copy.deepcopy(body[: len(body) + extra] if extra < 0 else [*body, user("next")])
    if edit_at is not None:
        request[edit_at]["content"] = "rewritten at 12:00:07"
    surface = surface_of(request, [record])
    assert missed_checkpoints([record], surface, len(request)) is missed
