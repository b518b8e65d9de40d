"""The pure conversation model: canonical hashing, chains, records and the surface."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import orjson
import pytest

from compaction_proxy.conversation.messages import (
    branch_fingerprint,
    canonical_message,
    chain_hashes,
    chain_root,
    conversation_id,
    is_valid_session_id,
    live_turn_start,
    message_digest,
    split_head,
)
from compaction_proxy.conversation.replacements import (
    Checkpoint,
    CheckpointEnd,
    Prune,
    ReplacementRecord,
    UnreadableRecord,
    pruned_message,
    record_from_dict,
    record_to_dict,
)
from compaction_proxy.conversation.surface import (
    Surface,
    SurfaceNode,
    derive_surface,
    missed_checkpoints,
)
from compaction_proxy.formats.chat import parse_chat_request
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.parsing.recent_bodies import RecentBodies
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
        end_fingerprint=branch_fingerprint([message_digest(m) for m in body], end),
    )


def prune_at(body: list[Message], position: int, content: str = "[pruned]") -> Prune:
    return Prune(position=position, hash=chain_hashes(ROOT, body)[position], content=content)


def surface_of(
    body: list[Message], records: list[ReplacementRecord], head: list[Message] | None = None
) -> Surface:
    return derive_surface(head or [], body, chain_hashes(ROOT, body), ROOT, records)


# -- canonical messages and chains ---------------------------------------------------------


EPHEMERAL = {"cache_control": {"type": "ephemeral"}}
TEXT_Y = {"type": "text", "text": "y"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


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
        # Caching clients move cache_control to the newest message every turn, turning a
        # string into one text part and back: the message stays the same message.
        (user("x"), {"role": "user", "content": [{"type": "text", "text": "x"}]}),
        (user("x"), {"role": "user", "content": [{"type": "text", "text": "x", **EPHEMERAL}]}),
        (
            {"role": "user", "content": [{"type": "text", "text": "x"}, TEXT_Y]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {**TEXT_Y, **EPHEMERAL}]},
        ),
        (
            {"role": "user", "content": [IMAGE, TEXT_Y]},
            {"role": "user", "content": [{**IMAGE, **EPHEMERAL}, TEXT_Y]},
        ),
        (
            tool("a", "out"),
            {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "out"}]},
        ),
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
        (user("x"), {"role": "user", "content": [{"type": "text", "text": "x"}, TEXT_Y]}),
        (user("x"), {"role": "user", "content": [IMAGE]}),
        ({"role": "user", "content": [IMAGE]}, {"role": "user", "content": [IMAGE, TEXT_Y]}),
    ],
)
def test_semantically_different_messages_differ(first: Message, second: Message) -> None:
    assert canonical_message(first) != canonical_message(second)


# Messages in the shapes the canonical rules treat apart, with the digests and the chain the
# proxy has always given them: stored records and logs of existing conversations are found by
# these, so a change here strands every conversation already compacted.
STORED_SHAPES: list[Message] = [
    system("You are a coding agent."),
    {
        "role": "user",
        "content": [{"type": "text", "text": "Fix it", "cache_control": {"type": "ephemeral"}}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"n": 123456789012345678901234}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "caf\u00e9 \U0001f600 ok"},
    {"role": "user", "content": "", "cache_control": {"type": "ephemeral"}},
    {"role": "assistant", "content": "done", "refusal": None, "name": "agent"},
]
STORED_DIGESTS = [
    "7a8e1e3ceaaaa8f9cd7efdc2b2f9feb6",
    "58d8a55d758ba7f04483b359bf6d114a",
    "706c25419bffb770dce6d9a1d0553baa",
    "4f8e5bc4aa40e65b9e3674247a6e4aab",
    "8f6efef5cbcad54993ecf276a209f480",
    "7288c6b44937b435323cd56a902afe07",
]
STORED_CHAIN_TIP = "761727ee3ea0ab6066fbd1ac290dbed8"


def test_digests_and_chains_are_those_existing_conversations_were_stored_under() -> None:
    assert [message_digest(m) for m in STORED_SHAPES] == STORED_DIGESTS
    assert chain_hashes(ROOT, STORED_SHAPES)[-1] == STORED_CHAIN_TIP
    # The request path's own digests: whole, then extending a body it remembers.
    known, recent = KnownMessages(), RecentBodies()
    shared = None
    for end in (3, len(STORED_SHAPES)):
        raw = orjson.dumps({"model": "m", "messages": STORED_SHAPES[:end]})
        request = parse_chat_request(raw, known, recent)
        assert request.digests == STORED_DIGESTS[:end]
        shared = request.lineage and request.lineage.shared
    assert shared == 3  # the second body was parsed as extending the first


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
        Prune(5, "dd", "[cleared]", chars_before=900, chars_after=9, masked=True),
    ],
)
def test_records_round_trip_through_plain_dicts(record: ReplacementRecord) -> None:
    assert record_from_dict(record_to_dict(record)) == record


def test_a_plain_prune_is_stored_as_before_masking_and_a_mask_reads_as_a_prune_without_it() -> None:
    plain = Prune(4, "cc", "x", chars_before=10, chars_after=2)
    assert "masked" not in record_to_dict(plain)
    mask = Prune(5, "dd", "[cleared]", chars_before=900, chars_after=9, masked=True)
    # A version that does not know the flag reads the placeholder as a prune's content.
    older = {k: v for k, v in record_to_dict(mask).items() if k != "masked"}
    assert record_from_dict(older).content == "[cleared]"
    with pytest.raises(UnreadableRecord):
        record_from_dict({**record_to_dict(mask), "masked": "yes"})


# -- surface derivation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "body"),
    [([], []), ([system("Be brief.")], []), ([], conversation(1)), ([system("x")], conversation())],
)
def test_a_surface_replacing_nothing_reads_as_the_requests_own_nodes(
    head: list[Message], body: list[Message]
) -> None:
    """Its nodes are made when read; they are what the surface would have listed."""
    surface = surface_of(body, [], head)
    expected = (
        *(SurfaceNode(m, "head") for m in head),
        *(SurfaceNode(m, "body", i, i) for i, m in enumerate(body)),
    )
    assert len(surface.nodes) == len(expected)
    assert surface.messages == [*head, *body]
    assert tuple(surface.nodes) == expected and surface.nodes == expected
    assert surface.nodes[1:] == expected[1:]
    if expected:
        assert surface.nodes[-1] == expected[-1]
    assert not surface.changed


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


def test_a_mask_wins_over_a_prune_at_its_position_whichever_came_first() -> None:
    body = conversation()
    prune = prune_at(body, 2, "head [...] tail")
    mask = dataclasses.replace(prune_at(body, 2, "[cleared]"), masked=True)
    for records in ([prune, mask], [mask, prune]):
        surface = surface_of(body, records)
        assert surface.messages[2] == {**body[2], "content": "[cleared]"}
        assert surface.prunes == surface.masks == (mask,)


def test_derivation_never_mutates_its_input() -> None:
    head, body = [system()], conversation()
    records: list[Any] = [checkpoint_over(body, 0, 2), prune_at(body, 6)]
    before = copy.deepcopy((head, body, records))
    surface_of(body, records, head)
    assert (head, body, records) == before


def branch_of(body: list[Message], change: str) -> list[Message]:
    """The request a client sends after committing a checkpoint over ``body[0..4]``."""
    request = copy.deepcopy([*body, user("next")])
    if change == "rewrite 0":  # a client that rewrites its first message every turn
        request[0]["content"] = "rewritten at 12:00:07"
    elif change == "rewrite 1":
        request[1]["content"] = "rewritten reply"
    elif change == "edit and branch":  # edited message 2 and went on from there
        request = [*request[:2], user("edited"), *agent_turns(5, output="another run")]
    elif change == "other conversation":  # same first message, another agent run
        request = [request[0], *agent_turns(6, output="other")]
    elif change == "too short":
        request = request[:4]
    return request


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ("none", False),  # the checkpoint applies
        ("rewrite 0", True),  # same messages at the checkpoint's end, an early one rewritten
        ("rewrite 1", True),
        ("edit and branch", False),  # its own branch: other messages at that position
        ("other conversation", False),  # shares only the first message
        ("too short", False),  # cannot have used the checkpoint anyway
    ],
)
def test_a_checkpoint_miss_counts_only_on_the_requests_own_branch(
    change: str, missed: bool
) -> None:
    body = conversation()
    record = checkpoint_over(body, 0, 4)
    request = branch_of(body, change)
    surface = surface_of(request, [record])
    digests = [message_digest(m) for m in request]
    assert missed_checkpoints([CheckpointEnd.of(record)], surface, digests) is missed


def test_a_checkpoint_without_a_fingerprint_never_counts_as_missed() -> None:
    body = conversation()
    record = dataclasses.replace(checkpoint_over(body, 0, 4), end_fingerprint="")
    request = branch_of(body, "rewrite 0")
    digests = [message_digest(m) for m in request]
    ends = [CheckpointEnd.of(record)]
    assert not missed_checkpoints(ends, surface_of(request, [record]), digests)


@pytest.mark.parametrize(
    ("body", "start"),
    [
        ([user("task")], 0),  # no answer yet: everything is live
        ([user("task"), assistant("a"), user("more"), user("and more")], 2),
        ([user("t"), assistant(None, ("c1", "f", "{}"), ("c2", "f", "{}"))], 2),
        ([user("t"), assistant(None, ("c1", "f", "{}")), tool("c1", "out")], 2),
        ([user("t"), assistant("a"), tool("x", "out"), assistant("b")], 4),  # prefill: none
        ([], 0),
    ],
)
def test_the_live_turn_starts_after_the_last_assistant_message(
    body: list[Message], start: int
) -> None:
    assert live_turn_start(body) == start


def test_a_prune_applies_to_the_message_as_resent_keeping_its_part_fields() -> None:
    text = "a" * 30 + "b" * 30
    made_from = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": text}]}
    prune = Prune(
        position=0,
        hash="h",
        content=[{"type": "text", "text": "aaaa"}],
        chars_before=60,
        chars_after=8,
        head_end=4,
        tail_start=56,
    )
    resent = {**made_from, "content": [{"type": "text", "text": text, **EPHEMERAL}]}
    pruned = pruned_message(resent, prune)
    assert pruned["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert pruned["content"][0]["text"].startswith("aaaa\n[... 52 characters removed")
    assert pruned["content"][0]["text"].endswith("bbbb")
    assert pruned_message(made_from, prune)["content"][0].keys() == {"type", "text"}


def test_a_prune_without_offsets_applies_its_stored_content() -> None:
    prune = Prune(position=0, hash="h", content="[pruned]")
    assert pruned_message(tool("c", "x" * 50), prune)["content"] == "[pruned]"


def test_integers_beyond_64_bits_hash_and_serialize_unchanged() -> None:
    from compaction_proxy.parsing import jsonio

    big = 123456789012345678901234567890
    raw = b'{"a":123456789012345678901234567890,"b":[1.5,"x"]}'
    parsed = jsonio.loads(raw)
    assert parsed["a"] == big and isinstance(parsed["a"], int)
    assert jsonio.dumps(parsed) == raw
    message = {"role": "user", "content": [{"type": "input_audio", "seq": big}]}
    assert b"123456789012345678901234567890" in canonical_message(message)


@pytest.mark.parametrize("offset", [0, 5, 1024 * 1024 - 24, 2 * 1024 * 1024 - 24, 3 * 1024 * 1024])
def test_a_big_integer_is_kept_wherever_it_falls_in_a_large_body(offset: int) -> None:
    """The scan for integers orjson cannot hold runs in windows; a run across a window's edge
    is still found."""
    from compaction_proxy.parsing import jsonio

    prefix = b'{"pad":"' + b"x" * offset + b'","n":'
    raw = prefix + b"12345678901234567890123}"
    assert jsonio.loads(raw)["n"] == 12345678901234567890123


@pytest.mark.parametrize(
    "number",
    [b"-9223372036854775809", b"-9223372036854775808", b"18446744073709551615", b"1" + b"0" * 20],
)
def test_a_document_orjson_refuses_reads_its_integers_as_orjson_reads_them(number: bytes) -> None:
    """A lone surrogate escape sends a document to the standard library: its integers still
    read as orjson's, so a body reads the same whole or a message at a time."""
    from compaction_proxy.parsing import jsonio

    read = jsonio.loads_fast(b'{"cut":"\\ud83d","n":' + number + b"}")["n"]
    expected = orjson.loads(number)
    assert (type(read), read) == (type(expected), expected)


@pytest.mark.parametrize(
    ("raw", "read"),
    [
        (b'{"a":"cut \\ud83d"}', {"a": "cut \ud83d"}),  # a lone high half
        (b'{"a":"\\udc00 and \\ud83d\\ude80"}', {"a": "\udc00 and \U0001f680"}),
        (b'{"a":"\\ud83d\\ude80"}', {"a": "\U0001f680"}),  # a pair: orjson reads it
    ],
)
def test_a_lone_surrogate_escape_is_read_as_json_allows_and_written_back_escaped(
    raw: bytes, read: dict[str, str]
) -> None:
    from compaction_proxy.parsing import jsonio

    assert jsonio.loads_fast(raw) == jsonio.loads(raw) == read
    assert jsonio.loads(jsonio.dumps(read)) == read


@pytest.mark.parametrize("raw", [b'{"a":"\\ud83d"', b'{"a":"\\uZZZZ"}', b'{"a":NaN,"b":"\\u00e9"}'])
def test_what_no_parser_reads_is_refused_in_orjsons_words(raw: bytes) -> None:
    import orjson

    from compaction_proxy.parsing import jsonio

    with pytest.raises(orjson.JSONDecodeError):
        jsonio.loads_fast(raw)


def test_records_inside_a_new_checkpoint_on_its_branch_are_superseded() -> None:
    from compaction_proxy.conversation.replacements import superseded_by

    body = conversation()
    chain = chain_hashes(ROOT, body)
    older, prune_in, prune_after = checkpoint_over(body, 0, 2), prune_at(body, 3), prune_at(body, 8)
    other_branch = dataclasses.replace(checkpoint_over(body, 0, 2), end_hash="elsewhere")
    newer = checkpoint_over(body, 0, 6)
    records = [older, prune_in, prune_after, other_branch]
    assert superseded_by(newer, records, chain) == [older, prune_in]
