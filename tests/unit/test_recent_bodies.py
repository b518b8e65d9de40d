"""A body parsed from a recent one it extends is exactly the body parsed whole: the same
object, the same digests, the same error, whatever the client's formatting or tricks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.formats.anthropic import parse_messages_request
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.chat import parse_chat_request
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.responses import (
    parse_responses_body,
    parse_responses_request,
    stateful,
)
from compaction_proxy.parsing import jsonio, recent_bodies
from compaction_proxy.parsing.json_layout import JSON_STRING, layout_of, string_end
from compaction_proxy.parsing.recent_bodies import RecentBodies
from tests.builders import assistant, system, tool, user
from tests.strategies import items as responses_junk
from tests.strategies import messages

pytest.importorskip("hypothesis")

from hypothesis import example, given, settings
from hypothesis import strategies as st

Style = Callable[[Any], bytes]
STYLES: dict[str, Style] = {
    "compact": lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    ),
    "spaced": lambda v: json.dumps(v).encode(),
    "indented": lambda v: json.dumps(v, indent=1).encode(),
}


def outcome(
    raw: bytes, known: KnownMessages, recent: RecentBodies | None, hint: str | None = None
) -> tuple[Any, ...]:
    try:
        request = parse_chat_request(raw, known, recent, hint)
    except BadRequest as error:
        return ("refused", error.message, error.param)
    return ("parsed", request.body, request.digests, request.model, request.stream)


def whole(raw: bytes) -> tuple[Any, ...]:
    return outcome(raw, KnownMessages(), None)


def body(history: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": history, **extra}


@pytest.mark.slow  # seconds of examples or waits: the full run has it
@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(messages, min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    style=st.sampled_from(sorted(STYLES)),
    model_last=st.booleans(),
    tools=st.booleans(),
)
def test_a_growing_conversation_parses_as_if_each_body_were_parsed_whole(
    history: list[Any], cuts: list[int], style: str, model_last: bool, tools: bool
) -> None:
    known, recent = KnownMessages(), RecentBodies()
    for cut in sorted(cuts):
        fields: dict[str, Any] = {"tools": [{"type": "function", "messages": [1]}]} if tools else {}
        value = body(history[:cut], **fields)
        if model_last:
            value = {"messages": value["messages"], **fields, "model": "m"}
        raw = STYLES[style](value)
        assert outcome(raw, known, recent) == whole(raw)


@pytest.mark.slow  # seconds of examples or waits: the full run has it
@settings(max_examples=300, deadline=None)
@given(
    tasks=st.lists(st.sampled_from(["Fix it.", "Fix it!", "Test it."]), min_size=2, max_size=3),
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 8), st.sampled_from(["own", "shared", None])),
        min_size=1,
        max_size=8,
    ),
    history=st.lists(messages, min_size=1, max_size=7),
    style=st.sampled_from(sorted(STYLES)),
)
@example(  # an integer beyond 64 bits, in a body whose earlier surrogate orjson refuses
    tasks=["Fix it.", "Fix it."],
    steps=[(0, 2, "own"), (0, 4, "own")],
    history=[
        {"role": [-9_223_372_036_854_775_809]},
        {"role": "system", "content": "\ud83d\ude00", "name": "\x1f"},
    ],
    style="compact",
)
def test_conversations_parse_as_if_whole_whatever_names_their_clients_give_them(
    tasks: list[str],
    steps: list[tuple[int, int, str | None]],
    history: list[Any],
    style: str,
) -> None:
    """Interleaved conversations sharing a system prompt, each body named after its own
    conversation, after one name all of them share, or not at all."""
    known, recent = KnownMessages(), RecentBodies()
    for index, cut, naming in steps:
        conversation = index % len(tasks)
        opening = [
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": tasks[conversation]},
        ]
        hint = {"own": f"c{conversation}", "shared": "everyone", None: None}[naming]
        raw = STYLES[style](body([*opening, *history][:cut]))
        assert outcome(raw, known, recent, hint) == whole(raw)


def plain(n: int) -> list[dict[str, Any]]:
    conversation: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}]
    for i in range(1, n):
        role = "user" if i % 2 else "assistant"
        conversation.append({"role": role, "content": f'turn {i} "quoted" [x] {{y}} \\ é'})
    return conversation


@pytest.mark.parametrize("style", sorted(STYLES))
def test_an_appended_body_is_parsed_from_the_recent_one(style: str) -> None:
    """Not vacuous: the path under test is the one taken, for every formatting."""
    known, recent = KnownMessages(), RecentBodies()
    parse_chat_request(STYLES[style](body(plain(3))), known, recent)
    raw = STYLES[style](body(plain(6)))
    extension = recent.extend(raw)
    assert extension is not None and extension.known == 3
    assert outcome(raw, known, recent) == whole(raw)


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(2, 9),
    edited=st.one_of(st.none(), st.integers(0, 8)),
    appended=st.integers(0, 3),
    style=st.sampled_from(sorted(STYLES)),
)
def test_a_body_extends_the_recent_one_by_every_message_it_repeats_and_no_more(
    count: int, edited: int | None, appended: int, style: str
) -> None:
    """Whichever message a client rewrites (the last, as a moved cache breakpoint does, or
    any earlier one), the body is taken to share exactly the messages before it; all of
    them when it rewrites none."""
    known, recent = KnownMessages(), RecentBodies()
    history = plain(count)
    parse_chat_request(STYLES[style](body(history)), known, recent)
    grown = [*history, *plain(count + appended)[count:]]
    shared = count
    if edited is not None:
        shared = edited = min(edited, count - 1)
        grown[edited] = {**grown[edited], "content": f"{grown[edited]['content']} (edited)"}
        if edited < 2:
            shared = 0  # the first two messages file a body (its key): none is found
    raw = STYLES[style](body(grown))
    extension = recent.extend(raw)
    assert (extension.known if extension is not None else 0) == shared
    assert outcome(raw, known, recent) == whole(raw)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_body_ending_as_the_recent_one_did_takes_its_other_members_as_they_were(
    style: str,
) -> None:
    """Not vacuous: past the first extension, the members after the array are not parsed
    again (the same objects), and the body is still the one a whole parse makes."""
    known, recent = KnownMessages(), RecentBodies()
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    requests = [
        parse_chat_request(STYLES[style](body(plain(turns), tools=tools)), known, recent)
        for turns in (3, 5, 7)
    ]
    assert requests[2].body["tools"] is requests[1].body["tools"]
    assert requests[1].body["tools"] is not requests[0].body["tools"]
    raw = STYLES[style](body(plain(7), tools=tools))
    assert outcome(raw, known, recent) == whole(raw)


def test_a_named_conversations_body_is_found_by_its_name_without_looking_for_its_opening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not vacuous: under a name, neither the array nor the opening messages are looked
    for (only what follows the remembered messages is scanned), and the body is still the
    one a whole parse makes."""
    known, recent = KnownMessages(), RecentBodies()
    compact = STYLES["compact"]
    parse_chat_request(compact(body(plain(3))), known, recent, "conversation-1")
    scan = recent_bodies.scan_elements

    def no_array(raw: bytes, name: str) -> None:
        raise AssertionError("looked for the array")

    def no_opening(raw: bytes, pos: int, after_element: bool, limit: int | None = None) -> Any:
        assert after_element, "scanned the opening messages"
        return scan(raw, pos, after_element, limit)

    monkeypatch.setattr(recent_bodies, "top_level_array", no_array)
    monkeypatch.setattr(recent_bodies, "scan_elements", no_opening)
    raw = compact(body(plain(6)))
    extension = recent.extend(raw, hint="conversation-1")
    assert extension is not None and extension.known == 3
    assert outcome(raw, known, recent, "conversation-1") == whole(raw)


def test_a_name_that_leads_to_another_conversation_falls_back_to_the_opening() -> None:
    """Two conversations of one agent under one name: the name leads to the other one's
    body, which shares only the system prompt; the body's own is still found."""
    known, recent = KnownMessages(), RecentBodies()
    compact = STYLES["compact"]
    first = plain(3)
    other = [first[0], {"role": "user", "content": "Another task."}, *first[2:]]
    parse_chat_request(compact(body(first)), known, recent, "one-name")
    parse_chat_request(compact(body(other)), known, recent, "one-name")
    raw = compact(body(plain(6)))
    extension = recent.extend(raw, hint="one-name")
    assert extension is not None and extension.known == 3
    assert outcome(raw, known, recent, "one-name") == whole(raw)


def test_a_name_never_changes_where_a_body_is_filed() -> None:
    """A first body of one message is filed under that message; the next, of three, under its
    first two. Named, the second is not taken from the first (its key would say one message),
    so the third, unnamed, still finds it by its opening."""
    known, recent = KnownMessages(), RecentBodies()
    compact = STYLES["compact"]
    parse_chat_request(compact(body(plain(1))), known, recent, "named")
    second = compact(body(plain(3)))
    assert recent.extend(second, hint="named") is None
    assert outcome(second, known, recent, "named") == whole(second)
    third = compact(body(plain(5)))
    extension = recent.extend(third)
    assert extension is not None and extension.known == 3
    assert outcome(third, known, recent) == whole(third)


def chain_of(tenant: str, raw: bytes, known: KnownMessages, recent: RecentBodies) -> list[str]:
    """The body chain of ``raw`` as the proxy derives it (from a recent body's chain when it
    has one), after checking it against the chain hashed from nothing."""
    request = parse_chat_request(raw, known, recent)
    view = RequestView.of(
        tenant, "m", request.messages, None, digests=request.digests, lineage=request.lineage
    )
    assert view.chain == RequestView.of(tenant, "m", request.messages, None).chain
    return view.chain


valid_messages = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
        "content": st.sampled_from(["a", "b", "same"]),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    shared=st.lists(valid_messages, min_size=1, max_size=6),
    forks=st.lists(st.lists(valid_messages, max_size=4), min_size=1, max_size=2),
    steps=st.lists(
        st.tuples(st.integers(0, 1), st.integers(1, 10), st.sampled_from(["t1", "t2"])),
        min_size=1,
        max_size=6,
    ),
)
def test_a_chain_started_from_a_recent_bodys_chain_is_the_chain_hashed_whole(
    shared: list[Any], forks: list[list[Any]], steps: list[tuple[int, int, str]]
) -> None:
    """Whatever the order of bodies (growing, shrinking, forking, another tenant's)."""
    known, recent = KnownMessages(), RecentBodies()
    for fork, cut, tenant in steps:
        history = [*shared, *forks[fork % len(forks)]][:cut]
        chain_of(tenant, STYLES["compact"](body(history)), known, recent)


def test_an_appended_bodys_chain_is_hashed_from_where_the_recent_one_ends() -> None:
    """Not vacuous: the shared positions' chain is taken, not hashed again."""
    known, recent = KnownMessages(), RecentBodies()
    first = chain_of("t", STYLES["compact"](body(plain(3))), known, recent)
    request = parse_chat_request(STYLES["compact"](body(plain(6))), known, recent)
    assert request.lineage is not None
    root = RequestView.of("t", "m", request.messages, None).root
    assert list(request.lineage.known(root, 1)) == first  # a system message, two shared
    assert request.lineage.known("another tenant's root", 1) == ()


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"\\" * 20, b"\\" * 17, b"\\", b'"', b"x", b"\n", "é".encode()]),
        max_size=30,
    )
)
def test_a_strings_end_is_found_as_the_escape_aware_expression_finds_it(
    pieces: list[bytes],
) -> None:
    raw = b'"' + b"".join(pieces)
    match = JSON_STRING.match(raw)
    assert string_end(raw, 0) == (match.end() if match else None)


def tricks() -> list[tuple[str, bytes]]:
    base = json.dumps(body(plain(6)), separators=(",", ":")).encode()
    cut = base.rindex(b',{"role"')  # before the last message
    last = base[cut + 1 : base.rindex(b"]")]
    return [
        ("a second messages key wins", base[:-1] + b',"messages":[]}'),
        ("a second messages key holding the nonce shape", base[:-1] + b',"messages":["x"]}'),
        ("garbage between messages", base[:cut] + b" x " + base[cut:]),
        ("a trailing comma", base[: base.rindex(b"]")] + b",]" + base[base.rindex(b"]") + 1 :]),
        ("a message that is no object", base[: base.rindex(b"]")] + b",7]}"),
        ("an unterminated string", base[:cut] + b',{"role":"user","content":"x}]}'),
        ("the last message rewritten", base[:cut] + b',{"role":"user","content":"new"}]}'),
        ("an early message rewritten", base.replace(b"turn 1", b"turn one", 1)),
        ("model missing", base.replace(b'"model":"m",', b"")),
        ("a repeated last message", base[: base.rindex(b"]")] + b"," + last + b"]}"),
        ("nothing new", base),
        ("trailing garbage", base + b"x"),
        (
            "deep nesting",
            base[:cut] + b',{"role":"user","content":' + b"[" * 600 + b"]" * 600 + b"}]}",
        ),
    ]


@pytest.mark.parametrize("hint", [None, "named"], ids=["unnamed", "named"])
@pytest.mark.parametrize("earlier", [[5], [4, 5]], ids=["parsed whole", "itself extended"])
@pytest.mark.parametrize(("trick", "raw"), tricks(), ids=[t for t, _ in tricks()])
def test_a_body_that_plays_tricks_on_a_recent_one_parses_as_if_whole(
    trick: str, raw: bytes, earlier: list[int], hint: str | None
) -> None:
    """Against a remembered body parsed whole, and one itself parsed as an extension (whose
    other members are taken as they were when the body ends as it did), found by its
    opening or by the conversation's name."""
    known, recent = KnownMessages(), RecentBodies()
    for turns in earlier:
        compact = json.dumps(body(plain(turns)), separators=(",", ":")).encode()
        parse_chat_request(compact, known, recent, hint)
    assert outcome(raw, known, recent, hint) == whole(raw)


def test_a_big_body_met_first_is_laid_out_by_its_messages_own_serialization() -> None:
    """Over the scan limit, compact JSON is laid out by matching each message's bytes; other
    formatting is not laid out (and is simply parsed whole next time)."""
    history = [{"role": "user", "content": "x" * 70_000}, *plain(4)[1:]]
    compact = json.dumps(body(history), separators=(",", ":"), ensure_ascii=False).encode()
    spaced = json.dumps(body(history)).encode()
    assert layout_of(compact, history) is not None
    assert layout_of(spaced, history) is None


def test_held_bytes_stay_within_the_bound() -> None:
    known, recent = KnownMessages(), RecentBodies(max_bytes=200_000)
    for conversation in range(20):
        history = [{"role": "system", "content": f"prompt {conversation}"}, *plain(4)[1:]]
        history[1]["content"] += "y" * 2_000
        parse_chat_request(json.dumps(body(history)).encode(), known, recent)
        assert recent.held_bytes <= 200_000
    assert recent.held_bytes > 0


# -- the Responses API's input ---------------------------------------------------------------

response_items = (
    st.sampled_from(
        [
            {"role": "user", "content": "Fix it."},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {"type": "reasoning", "id": "r1", "encrypted_content": "x"},
            {"type": "web_search_call", "id": "w1"},
        ]
    )
    | responses_junk
)


def responses_outcome(
    raw: bytes, known: KnownMessages, recent: RecentBodies | None, hint: str | None = None
) -> tuple[Any, ...]:
    try:
        parsed, extension = parse_responses_body(raw, recent, hint)
        if stateful(parsed):
            return ("stateful", parsed)
        request = parse_responses_request(parsed, raw, known, recent, extension, hint)
    except BadRequest as error:
        return ("refused", error.message, error.param)
    view = RequestView.of(
        "t", "m", request.messages, None, digests=request.digests, lineage=request.lineage
    )
    assert view.chain == RequestView.of("t", "m", request.messages, None).chain
    return ("parsed", request.body, request.messages, request.groups, request.digests)


@settings(max_examples=300, deadline=None)
@given(
    shared=st.lists(response_items, min_size=1, max_size=6),
    forks=st.lists(st.lists(response_items, max_size=4), min_size=1, max_size=2),
    steps=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.integers(1, 10),
            st.sampled_from([None, "Be brief.", "Be thorough."]),
            st.sampled_from(sorted(STYLES)),
        ),
        min_size=1,
        max_size=6,
    ),
    hint=st.sampled_from([None, "conversation"]),
)
def test_a_growing_responses_conversation_parses_as_if_each_body_were_parsed_whole(
    shared: list[Any],
    forks: list[list[Any]],
    steps: list[tuple[int, int, str | None, str]],
    hint: str | None,
) -> None:
    """Translation, digests and chain included, whatever the order of bodies and however
    their instructions change, named by the client or not."""
    known, recent = KnownMessages(), RecentBodies()
    for fork, cut, instructions, style in steps:
        value: dict[str, Any] = {"model": "m", "input": [*shared, *forks[fork % len(forks)]][:cut]}
        if instructions is not None:
            value["instructions"] = instructions
        raw = STYLES[style](value)
        assert responses_outcome(raw, known, recent, hint) == responses_outcome(
            raw, KnownMessages(), None
        )


def test_an_appended_responses_body_is_translated_from_the_recent_one() -> None:
    """Not vacuous: the shared messages are the remembered body's own, and so is their chain."""
    first_items = [
        {"role": "user", "content": "Fix it."},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    more = [{"type": "function_call", "call_id": "c2", "name": "bash", "arguments": "{}"}]
    known, recent = KnownMessages(), RecentBodies()
    raw = STYLES["compact"]({"model": "m", "instructions": "Be brief.", "input": first_items})
    body, _ = parse_responses_body(raw, recent)
    first = parse_responses_request(body, raw, known, recent)
    raw = STYLES["compact"](
        {"model": "m", "instructions": "Be brief.", "input": [*first_items, *more]}
    )
    body, extension = parse_responses_body(raw, recent)
    assert extension is not None and extension.known == 3
    second = parse_responses_request(body, raw, known, recent, extension)
    # Instructions, the user's message and the call are taken; the output, last of the
    # shared messages, is translated again.
    assert all(a is b for a, b in zip(second.messages[:3], first.messages[:3], strict=True))
    assert second.messages[3] is not first.messages[3]
    assert second.lineage is not None and second.lineage.shared == 3


BIG = 12345678901234567890123  # beyond 64 bits: orjson reads it as a float


valid_messages = st.one_of(
    st.builds(user, st.text(max_size=20)),
    st.builds(assistant, st.text(max_size=20)),
    st.builds(lambda text: tool("call_0", text), st.text(max_size=20)),
)


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(valid_messages | messages, min_size=1, max_size=8),
    big_at=st.sets(st.integers(0, 7), max_size=2),
    scanned=st.lists(st.booleans(), min_size=8, max_size=8),
    style=st.sampled_from(sorted(STYLES)),
)
def test_a_body_scanned_from_where_it_extends_a_clean_one_finds_what_a_whole_scan_finds(
    history: list[Any], big_at: set[int], scanned: list[bool], style: str
) -> None:
    """Whichever earlier bodies of the conversation were scanned, and wherever an integer
    beyond 64 bits stands, the scan of a body says what a scan of all its bytes says."""
    history = [{**m, "seq": BIG} if i in big_at else m for i, m in enumerate(history)]
    known, recent = KnownMessages(), RecentBodies()
    for cut in range(1, len(history) + 1):
        raw = STYLES[style](body(history[:cut]))
        try:
            request = parse_chat_request(raw, known, recent)
        except BadRequest:
            continue
        if scanned[cut - 1]:
            assert request.may_hold_a_big_integer() == jsonio.may_hold_a_big_integer(raw)


def test_a_body_is_scanned_only_where_it_differs_from_a_remembered_one_found_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts: list[int] = []
    scan = jsonio.may_hold_a_big_integer

    def recorded(raw: bytes, start: int = 0) -> bool:
        starts.append(start)
        return scan(raw, start)

    monkeypatch.setattr(jsonio, "may_hold_a_big_integer", recorded)
    known, recent = KnownMessages(), RecentBodies()
    history = [system(), user("task " * 40), assistant("reading")]
    first = STYLES["compact"](body(history))
    assert not parse_chat_request(first, known, recent).may_hold_a_big_integer()
    history.append({**user("output"), "seq": BIG})
    second = STYLES["compact"](body(history))
    assert parse_chat_request(second, known, recent).may_hold_a_big_integer()
    history.append(assistant("next"))
    third = STYLES["compact"](body(history))
    assert parse_chat_request(third, known, recent).may_hold_a_big_integer()
    # The first from its start; the second from its new message on (the shared bytes end
    # with the first body's last message); the third whole, since the second was not clean.
    assert starts == [0, first.rindex(b"]"), 0]


# -- Anthropic's Messages ------------------------------------------------------------------

valid_turns = st.sampled_from(
    [
        {"role": "user", "content": "Fix it."},
        {"role": "user", "content": []},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "done"},
                {"type": "text", "text": "and then?"},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text"}]},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s1"},
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"c": 1}},
            ],
        },
        {"role": "assistant", "content": "Done."},
        {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]},
    ]
)
turns = valid_turns | responses_junk  # junk as often as not: in forks only


def messages_outcome(
    raw: bytes, known: KnownMessages, recent: RecentBodies | None, hint: str | None = None
) -> tuple[Any, ...]:
    try:
        request = parse_messages_request(raw, known, (), recent, hint)
    except BadRequest as error:
        return ("refused", error.message, error.param)
    view = RequestView.of(
        "t", "m", request.messages, None, digests=request.digests, lineage=request.lineage
    )
    assert view.chain == RequestView.of("t", "m", request.messages, None).chain
    translated = request.translation
    entries = [(e.turn, e.role, e.content) for e in translated.entries]
    return ("parsed", request.body, request.messages, request.groups, request.digests, entries)


@settings(max_examples=300, deadline=None)
@given(
    shared=st.lists(valid_turns, min_size=1, max_size=6),
    forks=st.lists(
        st.lists(valid_turns, max_size=4) | st.lists(turns, max_size=3), min_size=2, max_size=2
    ),
    steps=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.integers(1, 10),
            st.sampled_from([None, "Be brief.", [{"type": "text", "text": "Be brief."}], 7]),
            st.sampled_from(sorted(STYLES)),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
    hint=st.sampled_from([None, "conversation"]),
)
def test_a_growing_messages_conversation_parses_as_if_each_body_were_parsed_whole(
    shared: list[Any],
    forks: list[list[Any]],
    steps: list[tuple[int, int, Any, str, bool]],
    hint: str | None,
) -> None:
    """Anthropic's Messages: translation, entries, digests and chain included, whatever the
    order of bodies, however their ``system`` changes (or is not valid), and wherever a
    breakpoint stands (on the newest turn's last block, as Claude Code moves it, or none)."""
    known, recent = KnownMessages(), RecentBodies()
    for fork, cut, system_prompt, style, marked in steps:
        history = [*shared, *forks[fork % len(forks)]][:cut]
        newest = history[-1] if history else None
        if marked and isinstance(newest, dict) and isinstance(newest.get("content"), list):
            blocks = newest["content"]
            if blocks and isinstance(blocks[-1], dict):
                last = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
                history[-1] = {**newest, "content": [*blocks[:-1], last]}
        value: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": history}
        if system_prompt is not None:
            value["system"] = system_prompt
        raw = STYLES[style](value)
        assert messages_outcome(raw, known, recent, hint) == messages_outcome(
            raw, KnownMessages(), None
        )


def test_an_appended_messages_body_is_translated_from_the_recent_one() -> None:
    """Not vacuous: the shared turns' messages are the remembered body's own."""
    first_turns = [
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
    ]
    more = [{"role": "assistant", "content": "Done."}]
    known, recent = KnownMessages(), RecentBodies()
    value = {"model": "m", "max_tokens": 9, "system": "Be brief.", "messages": first_turns}
    first = parse_messages_request(STYLES["compact"](value), known, (), recent)
    raw = STYLES["compact"]({**value, "messages": [*first_turns, *more]})
    second = parse_messages_request(raw, known, (), recent)
    assert second.lineage is not None and len(second.messages) == 5
    assert all(a is b for a, b in zip(second.messages[:4], first.messages[:4], strict=True))
    assert second.digests is not None and second.digests[:4] == first.digests


@settings(max_examples=60, deadline=None)
@given(turns=st.integers(3, 40), moved=st.data(), kind=st.sampled_from(["text", "image", "edit"]))
def test_a_moved_cache_breakpoint_reuses_every_turn_up_to_it_and_its_own_when_only_it_moved(
    turns: int, moved: st.DataObject, kind: str
) -> None:
    """Claude Code moves its breakpoint from the turn it sent last to the newest: a body
    differing from the remembered one at any earlier turn past its first two (the opening a
    body is filed under) is translated from the remembered turns before that turn, exactly
    (not vacuous: the shared messages are the same objects); that turn's own too when only a
    breakpoint on a text block moved, its entry then the block as now sent. A breakpoint on
    an image (a part kept as sent) or an edited text is translated again."""
    image = {"type": "image", "source": {"type": "base64", "data": "AA=="}}
    history = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": f"turn {i}"}, image],
        }
        for i in range(turns)
    ]
    changed = moved.draw(st.integers(2, turns - 1))
    known, recent = KnownMessages(), RecentBodies()
    value = {"model": "m", "max_tokens": 9, "messages": history}
    first = parse_messages_request(STYLES["compact"](value), known, (), recent)
    later = [{**turn, "content": list(turn["content"])} for turn in history]
    at = 1 if kind == "image" else 0
    block = later[changed]["content"][at]
    if kind == "edit":
        block = {**block, "text": "edited"}
    later[changed]["content"][at] = {**block, "cache_control": {"type": "ephemeral"}}
    raw = STYLES["compact"]({**value, "messages": [*later, {"role": "user", "content": "go"}]})
    second = parse_messages_request(raw, known, (), recent)
    whole = messages_outcome(raw, KnownMessages(), None)
    assert (second.messages, second.digests) == (whole[2], whole[4])
    assert [(e.turn, e.role, e.content) for e in second.translation.entries] == whole[5]
    assert all(a is b for a, b in zip(second.messages[:changed], first.messages, strict=False))
    assert (second.messages[changed] is first.messages[changed]) is (kind == "text")


def test_a_function_call_after_an_answer_and_its_reasoning_parses_as_the_whole_body() -> None:
    """Found by the property above: the answer, then reasoning, then (in the next body) the
    call the reasoning led to. The call joins the assistant's turn, so no message of that turn
    may be reused from the body before."""
    items = [
        {"role": "user", "content": "Fix it."},
        {"role": "user", "content": "Fix it."},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"type": "reasoning", "id": "r1", "encrypted_content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
    ]
    known, recent = KnownMessages(), RecentBodies()
    for cut in (4, 5):
        value = {"model": "m", "input": items[:cut], "instructions": "Be brief."}
        raw = STYLES["spaced"](value)
        assert responses_outcome(raw, known, recent) == responses_outcome(
            raw, KnownMessages(), None
        )


def test_surrogates_encoded_in_utf8_are_refused_whatever_else_the_body_holds() -> None:
    """Found by the property above: a body holding an unrelated escape was read again by the
    standard library, which let encoded surrogates through where orjson refuses them; the
    same bytes refused or not, and a body extending it parsed where the whole one is
    refused."""
    cesu = '"output":"\ud83d\ude00"'.encode("utf-8", "surrogatepass")
    with_escape = b'{"model":"m","input":[{' + cesu + b'},{"type":"\\u0007"}]}'
    without = b'{"model":"m","input":[{' + cesu + b"}]}"
    for raw in (with_escape, without):
        assert responses_outcome(raw, KnownMessages(), None)[0] == "refused"
