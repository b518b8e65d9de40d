"""Anthropic's Messages API on the chat-shaped core (``formats.messages``): translated one way,
written back from the client's own blocks (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.formats.anthropic import (
    LONG_CONTEXT_WINDOW,
    declared_window,
    messages_payload,
    parse_messages_request,
)
from compaction_proxy.formats.anthropic_blocks import (
    MAX_BREAKPOINTS,
    breakpoints_in,
    translate_messages,
    turns_for,
)
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.parsing import jsonio
from compaction_proxy.testing.fake_messages import sign, thinking_refusal

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

SUMMARY = {"role": "user", "content": "<compacted-summary>earlier work</compacted-summary>"}


def view_of(body: dict[str, Any]) -> RequestView:
    return RequestView.of("tenant", "claude", translate_messages(body).messages, None)


def written(body: dict[str, Any], records: list[Checkpoint | Prune]) -> list[dict[str, Any]]:
    translated = translate_messages(body)
    view = RequestView.of("tenant", "claude", translated.messages, None)
    return turns_for(view.surface(records), translated)


def tool_turns(index: int, output: str = "log line") -> list[dict[str, Any]]:
    call = f"toolu_{index}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": f"pondering {index}", "signature": f"sig{index}"},
                {"type": "text", "text": f"Running step {index}."},
                {"type": "tool_use", "id": call, "name": "bash", "input": {"cmd": f"ls {index}"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call, "content": f"{output} {index}"},
                {"type": "text", "text": f"(note {index})", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]


def session() -> dict[str, Any]:
    turns = [{"role": "user", "content": "Fix the importer."}]
    for index in range(4):
        turns += tool_turns(index)
    turns.append({"role": "user", "content": "Where are we?"})
    return {"model": "claude", "system": [{"type": "text", "text": "You code."}], "messages": turns}


def test_a_system_turn_inside_messages_is_kept_as_claude_code_sends_it() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        ]
    }
    assert translate_messages(body).messages[1]["role"] == "system"
    assert written(body, []) == body["messages"]


def test_calls_and_results_pair_as_chat_messages_and_thinking_names_its_turn() -> None:
    translated = translate_messages(session())
    system, first, call, result, note = translated.messages[:5]
    assert system == {"role": "system", "content": "You code."}
    assert first == {"role": "user", "content": "Fix the importer."}
    assert call["tool_calls"][0]["id"] == "toolu_0"
    assert call["tool_calls"][0]["function"]["arguments"] == '{"cmd":"ls 0"}'
    assert call["name"].startswith("thinking:")
    assert "pondering" not in str(call["content"])  # thinking is never what a summary reads
    assert result == {"role": "tool", "tool_call_id": "toolu_0", "content": "log line 0"}
    assert note["role"] == "user"


def test_an_unchanged_surface_writes_back_the_turns_as_sent() -> None:
    body = session()
    assert written(body, []) == body["messages"]


def test_a_checkpoint_is_a_user_turn_of_its_own_and_splits_a_turn_only_between_blocks() -> None:
    body = session()
    view = view_of(body)
    # Over the first message and the first tool round, its result included: the result's turn
    # keeps its note, as a user turn of its own after the checkpoint's.
    end = 2
    checkpoint = Checkpoint(
        0, end, view.root, view.chain[end], SUMMARY, tokens=10, shadowed_tokens=100
    )
    turns = written(body, [checkpoint])
    assert turns[0] == {"role": "user", "content": [{"type": "text", "text": SUMMARY["content"]}]}
    assert turns[1] == {"role": "user", "content": [body["messages"][2]["content"][1]]}
    assert turns[2:] == body["messages"][3:]


def test_a_pruned_result_keeps_its_block_and_every_other_field() -> None:
    body = session()
    view = view_of(body)
    prune = Prune(2, view.chain[2], "log [pruned]")
    turns = written(body, [prune])
    block = turns[2]["content"][0]
    assert block == {"type": "tool_result", "tool_use_id": "toolu_0", "content": "log [pruned]"}
    assert turns[2]["content"][1] == body["messages"][2]["content"][1]  # cache_control kept
    assert turns[1] == body["messages"][1]  # thinking, signature and all


_TEXT = {"type": "text", "text": "x"}
_RESULT = {"type": "tool_result", "tool_use_id": "toolu_0"}


def _turn(role: str, *blocks: Any) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": list(blocks)}]}


def _user(*blocks: Any) -> dict[str, Any]:
    return _turn("user", *blocks)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": [], "content": "x"}]}, "messages.0.role"),  # was a 500 (fuzz)
        ({"messages": [{"role": "user", "content": 7}]}, "messages.0.content"),
        (_user({"type": "text", "text": "a"}, {"text": "no type"}), "messages.0.content.1"),
        (_user({"type": "text", "text": "a"}, "x"), "messages.0.content.1"),
        (
            _user({"type": "text", "text": "a"}, {"type": "tool_result"}),
            "messages.0.content.1.tool_use_id",
        ),
        (_user({**_RESULT, "content": 5}), "messages.0.content.0.content"),
        (
            _user({**_RESULT, "content": [_TEXT, {"type": "text", "text": 3}]}),
            "messages.0.content.0.content.1.text",
        ),
        (_user({**_RESULT, "content": [_TEXT, "x"]}), "messages.0.content.0.content.1"),
        (_turn("assistant", _TEXT, {"type": "tool_use", "id": 1}), "messages.0.content.1"),
        (_turn("assistant", _TEXT, {"type": "text", "text": 5}), "messages.0.content.1.text"),
        (_user({"type": "text", "text": 5}), "messages.0.content.0.text"),
        (_user(_TEXT, {"type": "text", "text": 5}), "messages.0.content.1.text"),
        (_user(_TEXT, _RESULT, {"type": "text", "text": 5}), "messages.0.content.2.text"),
        ({"system": 3, "messages": []}, "system"),
    ],
)
def test_what_the_api_would_refuse_is_a_bad_request_naming_its_parameter(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        translate_messages(body)
    assert refused.value.param == param


text_block = st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=20))
image_block = st.just({"type": "image", "source": {"type": "base64", "data": "aGk="}})
user_content = st.one_of(
    st.text(max_size=30), st.lists(st.one_of(text_block, image_block), min_size=1, max_size=3)
)


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [{"role": "user", "content": draw(user_content)}]
    for index in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            turns += tool_turns(index, draw(st.text(max_size=15)))
        else:
            turns.append({"role": "assistant", "content": draw(st.text(max_size=20))})
            turns.append({"role": "user", "content": draw(user_content)})
    body: dict[str, Any] = {"model": "claude", "messages": turns}
    if draw(st.booleans()):
        body["system"] = draw(st.text(max_size=20))
    return body


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_any_conversation_is_written_back_as_sent_when_nothing_replaces_it(
    body: dict[str, Any],
) -> None:
    assert written(body, []) == body["messages"]


@pytest.mark.parametrize(
    ("headers", "window"),
    [
        ([], None),
        (["context-1m-2025-08-07"], LONG_CONTEXT_WINDOW),
        (["interleaved-thinking-2025-05-14,context-1m-2025-08-07"], LONG_CONTEXT_WINDOW),
        (["interleaved-thinking-2025-05-14", " context-1m-2025-08-07 "], LONG_CONTEXT_WINDOW),
        (["fine-grained-tool-streaming-2025-05-14"], None),
        (["not-context-1m"], None),
    ],
)
def test_only_the_1m_context_beta_declares_a_window(headers: list[str], window: int | None) -> None:
    assert declared_window(headers) == window


def claude_code_session(breakpoints: int) -> dict[str, Any]:
    """``session()`` with ``breakpoints`` breakpoints placed as Claude Code places them: the
    system prompt, the last tool, the newest user block, then an older note."""
    body = session()
    body["tools"] = [{"name": "bash", "input_schema": {"type": "object"}}]
    body["messages"][-1] = {"role": "user", "content": [{"type": "text", "text": "Where?"}]}
    for turn in body["messages"]:  # session()'s own notes carry none here
        if isinstance(turn["content"], list):
            for block in turn["content"]:
                block.pop("cache_control", None)
    places = [
        body["system"][-1],
        body["tools"][-1],
        body["messages"][-1]["content"][-1],
        body["messages"][-2]["content"][-1],
    ]
    for place in places[:breakpoints]:
        place["cache_control"] = {"type": "ephemeral"}
    return body


@pytest.mark.parametrize("breakpoints", [0, 1, 2, 3, 4])
def test_a_checkpoint_gets_a_breakpoint_only_for_a_caching_client_and_never_a_fifth(
    breakpoints: int,
) -> None:
    body = claude_code_session(breakpoints)
    translated = translate_messages(body)
    view = RequestView.of("tenant", "claude", translated.messages, None)
    checkpoint = Checkpoint(0, 2, view.root, view.chain[2], SUMMARY, tokens=10, shadowed_tokens=99)
    request = parse_messages_request(jsonio.dumps(body), KnownMessages())
    sent = jsonio.loads(messages_payload(request, view.surface([checkpoint])))
    assert breakpoints_in(body, body["messages"]) == breakpoints
    added = 1 if 0 < breakpoints < MAX_BREAKPOINTS else 0
    assert breakpoints_in(sent, sent["messages"]) == breakpoints + added
    summary_block = sent["messages"][0]["content"][-1]
    assert ("cache_control" in summary_block) == bool(added)
    assert {k: v for k, v in sent.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }


def test_the_fake_refuses_an_edited_or_missing_thinking_block_of_the_round_in_progress() -> None:
    thought = "Let me look."
    call = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}

    def body(*blocks: dict[str, Any]) -> dict[str, Any]:
        turns = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [*blocks, call]},
        ]
        return {"thinking": {"type": "enabled"}, "messages": [*turns, result]}

    signed = {"type": "thinking", "thinking": thought, "signature": sign(thought)}
    assert thinking_refusal(body(signed)) is None
    assert "Invalid `signature`" in str(thinking_refusal(body({**signed, "thinking": "Edited."})))
    assert "must start with a thinking block" in str(thinking_refusal(body()))
    # An older round's thinking may be left out: only the round in progress is checked.
    older = body(signed)
    older["messages"] += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "?"},
    ]
    older["messages"][1]["content"] = [call]
    assert thinking_refusal(older) is None
