"""Responses input items as chat messages for the core, and the surface written back as the
client's own items."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.conversation.messages import split_head
from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.conversation.surface import Surface, SurfaceNode
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.responses import parse_responses_request, stateful
from compaction_proxy.formats.responses_items import items_for, translate


def call(call_id: str, name: str = "bash") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def output(call_id: str, text: str = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def reasoning(ident: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": ident, "summary": [], "encrypted_content": "gAAA" + ident}


def test_items_become_chat_messages_and_a_turn_stays_one_message() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go"}]},
        reasoning("rs_1"),
        {"role": "assistant", "content": "Looking."},
        call("c1"),
        call("c2"),
        output("c1"),
        output("c2"),
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]
    translated = translate({"model": "m", "instructions": "Rules.", "input": items})
    roles = [m["role"] for m in translated.messages]
    assert roles == ["system", "developer", "user", "assistant", "tool", "tool", "assistant"]
    assert translated.groups == [(), (0,), (1,), (2, 3, 4, 5), (6,), (7,), (8,)]
    turn = translated.messages[3]
    assert [c["id"] for c in turn["tool_calls"]] == ["c1", "c2"]
    assert turn["content"] == "Looking." and turn["name"] == "reasoning:rs_1"
    assert translated.messages[2]["content"] == [{"type": "text", "text": "Go"}]
    opaque = translated.messages[6]
    assert opaque["name"] == "item:web_search_call" and "ws_1" in opaque["content"]
    head, _ = split_head(translated.messages)
    assert len(head) == 2  # instructions and the developer message


def test_reasoning_text_is_never_in_the_messages() -> None:
    translated = translate({"model": "m", "input": [reasoning("rs_9"), call("c"), output("c")]})
    assert "gAAA" not in str(translated.messages)


def test_the_surface_is_written_back_from_the_clients_own_items() -> None:
    items = [
        {"role": "user", "content": "Task"},
        call("c1"),
        output("c1", "x" * 50),
        reasoning("rs_2"),
        call("c2"),
        output("c2", "y" * 50),
        {"role": "user", "content": "Next?"},
    ]
    translated = translate({"model": "m", "input": items})
    messages = translated.messages
    summary = {"role": "user", "content": "<compacted-summary>done</compacted-summary>"}
    checkpoint = Checkpoint(0, 2, "", "", summary, 5)
    prune = Prune(5, "", "y[cut]", chars_before=50, chars_after=6)
    pruned = {**messages[4], "content": "y[cut]"}
    surface = Surface(
        (
            SurfaceNode(summary, "checkpoint", 0, 2),
            SurfaceNode(messages[3], "body", 3, 3),
            SurfaceNode(pruned, "pruned", 4, 4),
            SurfaceNode(messages[5], "body", 5, 5),
        ),
        (checkpoint,),
        (prune,),
    )
    written = items_for(surface, translated.groups, items)
    assert written == [
        {"type": "message", "role": "user", "content": summary["content"]},
        items[3],
        items[4],  # the reasoning item and its call, together and as sent
        {**items[5], "output": "y[cut]"},
        items[6],
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": [], "content": "x"}]}, "input[0].role"),  # found by the fuzz test
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        ({"input": [output("c", 7)]}, "input[0].output"),  # type: ignore[arg-type]
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
        ),
        ({"input": "x", "instructions": ["no"]}, "instructions"),
    ],
)
def test_what_the_api_would_refuse_is_a_400_naming_the_param(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        translate({"model": "m", **body})
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, False), ({"previous_response_id": "resp_1"}, True), ({"conversation": "conv_1"}, True)],
)
def test_stateful_requests_are_recognised(extra: dict[str, Any], expected: bool) -> None:
    assert stateful({"model": "m", "input": "x", **extra}) is expected


@pytest.mark.parametrize(
    ("extra", "cap"), [({}, None), ({"max_output_tokens": 700}, 700), ({"max_tokens": 700}, None)]
)
def test_a_responses_answer_cap_is_max_output_tokens(
    extra: dict[str, Any], cap: int | None
) -> None:
    body = {"model": "m", "input": "hello", **extra}
    request = parse_responses_request(body, orjson.dumps(body), KnownMessages())
    assert request.answer_cap == cap
