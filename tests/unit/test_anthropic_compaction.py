"""Anthropic's ``context_management`` (pure): edits read with the API's defaults and refused
in its words, the compaction block opened in place of the history before it, and the answer
edited with the block first and what was done."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest

from compaction_proxy.formats.answer_edits import sse_event
from compaction_proxy.formats.anthropic_compaction import (
    ManagedAnswer,
    asked_compaction,
    compaction_block,
    edited_turns,
    opened_blocks,
    paused_answer,
)
from compaction_proxy.formats.anthropic_count import cleared_for_count
from compaction_proxy.formats.asked_compaction import (
    AskedCompaction,
    ClearedToolUses,
    ClearToolUses,
)
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.sealed_checkpoints import MadeCompaction

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

MADE = MadeCompaction("the summary", "cpx1.payload.mac", input_tokens=40, output_tokens=7)


def edits(*given: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "context_management": {"edits": list(given)}}


def test_edits_take_the_apis_defaults() -> None:
    asked = asked_compaction(
        edits({"type": "compact_20260112"}, {"type": "clear_tool_uses_20250919"})
    )
    assert asked is not None and asked.threshold == 150_000 and not asked.pause
    assert asked.clear_tool_uses == ClearToolUses()
    assert asked_compaction({"model": "m"}) is None


def test_edits_read_their_parameters() -> None:
    asked = asked_compaction(
        edits(
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 5},
                "keep": {"type": "tool_uses", "value": 1},
                "clear_at_least": {"type": "input_tokens", "value": 300},
                "exclude_tools": ["web_search"],
                "clear_tool_inputs": ["bash"],
            },
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
            {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": 9_000},
                "pause_after_compaction": True,
                "instructions": "Keep the plan.",
            },
        )
    )
    assert asked is not None
    assert (asked.threshold, asked.pause, asked.instructions) == (9_000, True, "Keep the plan.")
    assert asked.clear_tool_uses == ClearToolUses(
        trigger_tokens=None,
        trigger_tool_uses=5,
        keep=1,
        clear_at_least=300,
        exclude_tools=frozenset({"web_search"}),
        clear_inputs=frozenset({"bash"}),
    )
    assert asked.keep_thinking_turns == 2
    everything = asked_compaction(edits({"type": "clear_thinking_20251015", "keep": "all"}))
    assert everything is not None and everything.keep_thinking_turns is None


@pytest.mark.parametrize(
    ("management", "param"),
    [
        ({"edits": "all"}, "context_management.edits"),
        ({"edits": [{"type": "clear_everything"}]}, "context_management.edits.0.type"),
        (
            {"edits": [{"type": "compact_20260112", "trigger": {"type": "turns", "value": 1}}]},
            "context_management.edits.0.trigger",
        ),
        (
            {
                "edits": [
                    {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}
                ]
            },
            "context_management.edits.0.keep.value",
        ),
        (
            {"edits": [{"type": "compact_20260112", "pause_after_compaction": "yes"}]},
            "context_management.edits.0.pause_after_compaction",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": [1]}]},
            "context_management.edits.0.exclude_tools",
        ),
    ],
)
def test_an_edit_the_api_would_refuse_is_refused_naming_it(management: Any, param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        asked_compaction({"model": "m", "context_management": management})
    assert refused.value.param == param


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=10,
    )
)
def test_any_context_management_is_read_or_refused_never_crashes(management: Any) -> None:
    with contextlib.suppress(BadRequest):
        asked_compaction({"model": "m", "context_management": management})


def test_the_history_up_to_the_block_becomes_the_checkpoint() -> None:
    block = compaction_block(MADE)
    body = {
        "messages": [
            {"role": "user", "content": "old task"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "Done."}]},
            {"role": "user", "content": "Go on."},
        ]
    }
    opened = opened_blocks(body, lambda token: f"<checkpoint {token}>")
    assert opened is not None
    assert opened["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "<checkpoint cpx1.payload.mac>"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        {"role": "user", "content": "Go on."},
    ]
    anthropics = {"type": "compaction", "content": "theirs", "encrypted_content": "opaque"}
    assert (
        opened_blocks({"messages": [{"role": "assistant", "content": [anthropics]}]}, str) is None
    )


def upstream_stream() -> bytes:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {"id": "msg_1", "content": [], "usage": {"input_tokens": 90}},
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    return b"".join(sse_event(e) for e in events)


def test_a_stream_gets_the_block_first_the_rest_one_up_and_what_was_done_at_the_end() -> None:
    applied = (
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 4, "cleared_input_tokens": 800},
    )
    editor = ManagedAnswer(MADE, applied).editor()
    stream = editor.feed(upstream_stream()) + editor.close()
    events = [orjson.loads(line[6:]) for line in stream.splitlines() if line.startswith(b"data: ")]
    starts = [
        (e["index"], e["content_block"]["type"])
        for e in events
        if e["type"] == "content_block_start"
    ]
    assert starts == [(0, "compaction"), (1, "text")]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["context_management"]["applied_edits"] == [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 4, "cleared_input_tokens": 800}
    ]
    assert [
        (i["type"], i["input_tokens"], i["output_tokens"]) for i in delta["usage"]["iterations"]
    ] == [
        ("compaction", 40, 7),
        ("message", 90, 3),
    ]


def test_a_whole_answer_gets_the_block_first_and_a_paused_one_the_block_alone() -> None:
    body = orjson.dumps({"content": [{"type": "text", "text": "Hi"}], "usage": {"input_tokens": 9}})
    edited = orjson.loads(ManagedAnswer(MADE, None).whole(body))
    assert [b["type"] for b in edited["content"]] == ["compaction", "text"]
    assert "context_management" not in edited
    paused = orjson.loads(paused_answer("msg_1", "m", MADE, stream=False))
    assert paused["content"] == [compaction_block(MADE)] and paused["stop_reason"] == "compaction"


def thinking_turns(count: int) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for index in range(count):
        blocks = [
            {"type": "thinking", "thinking": f"think {index}", "signature": f"s{index}"},
            {"type": "tool_use", "id": f"t{index}", "name": "bash", "input": {"n": index}},
        ]
        turns.append({"role": "assistant", "content": blocks})
        result = {"type": "tool_result", "tool_use_id": f"t{index}", "content": "out"}
        turns.append({"role": "user", "content": [result]})
    return {"model": "m", "messages": turns}


@pytest.mark.parametrize("keep", [0, 1, 2, 5])
def test_thinking_stays_in_the_newest_keep_turns_only(keep: int) -> None:
    asked = AskedCompaction(keep_thinking_turns=keep)
    edited, applied = edited_turns(thinking_turns(4), asked, None)
    kept = [
        i
        for i, turn in enumerate(edited["messages"])
        if any(b.get("type") == "thinking" for b in turn["content"] if isinstance(b, dict))
    ]
    assert kept == [1, 3, 5, 7][4 - min(keep, 4) :]
    cleared = [a for a in applied if a["type"] == "clear_thinking_20251015"]
    assert [a["cleared_thinking_turns"] for a in cleared] == ([4 - keep] if keep < 4 else [])


def test_cleared_calls_lose_their_inputs_when_asked() -> None:
    clear = ClearToolUses(clear_inputs=True)
    cleared = ClearedToolUses(2, 100, ("t0", "t1"))
    edited, applied = edited_turns(
        thinking_turns(3), AskedCompaction(clear_tool_uses=clear), cleared
    )
    inputs = [
        b["input"]
        for t in edited["messages"]
        for b in t["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    assert inputs == [{}, {}, {"n": 2}]
    assert applied[0]["cleared_tool_uses"] == 2 and applied[0]["cleared_input_tokens"] > 100


def results_of(body: dict[str, Any]) -> list[Any]:
    return [
        block["content"]
        for turn in body["messages"]
        for block in turn["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


@pytest.mark.parametrize(
    ("clear", "tokens", "kept"),
    [
        (ClearToolUses(trigger_tokens=100, keep=1), 500, 1),
        (ClearToolUses(trigger_tokens=1_000, keep=1), 500, None),  # under its trigger
        (ClearToolUses(trigger_tool_uses=3, keep=2), 0, 2),
        (ClearToolUses(trigger_tool_uses=5, keep=2), 0, None),
        (ClearToolUses(trigger_tokens=0, keep=0, exclude_tools=frozenset({"bash"})), 9, None),
        (ClearToolUses(trigger_tokens=0, keep=0, clear_at_least=10_000), 9, None),
    ],
)
def test_a_count_is_of_what_the_edits_would_leave(
    clear: ClearToolUses, tokens: int, kept: int | None
) -> None:
    body = thinking_turns(4)
    counted = cleared_for_count(body, AskedCompaction(clear_tool_uses=clear), tokens)
    if kept is None:
        assert counted is None
        return
    assert counted is not None
    results = results_of(counted)
    assert results[-kept:] == ["out"] * kept
    assert all("cleared" in r for r in results[:-kept])
