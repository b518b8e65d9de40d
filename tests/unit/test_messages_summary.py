"""Summary calls in Messages form (pure): the cache-safe one starts as the client's next
request would, byte for byte up to the span's end, with the fields of Anthropic's cache key as
the client sent them; the rebuilt one stands alone."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats.anthropic import messages_payload, parse_messages_request
from compaction_proxy.formats.anthropic_blocks import (
    MAX_BREAKPOINTS,
    breakpoints_in,
    translate_messages,
)
from compaction_proxy.formats.anthropic_summary import (
    cache_safe_summary_body,
    max_tokens_with_thinking,
    summary_messages_body,
    thinking_budget,
)
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.parsing import jsonio
from tests.unit.test_messages_format import claude_code_session

SUMMARY = {"role": "user", "content": "<compacted-summary>\nshort\n</compacted-summary>"}
INSTRUCTION = "Summarize the conversation above."


def unmarked(value: Any) -> Any:
    """``value`` without its ``cache_control`` markers: what the cache compares."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def call_for(body: dict[str, Any], span_end: int, cap: int = 500) -> tuple[Any, Any]:
    """The cache-safe call over a prefix ending at body message ``span_end`` (of a surface
    whose first two body messages a checkpoint stands for), and the turns forwarded for it."""
    translated = translate_messages(body)
    view = RequestView.of("tenant", "claude", translated.messages, None)
    checkpoint = Checkpoint(0, 1, view.root, view.chain[1], SUMMARY, tokens=5, shadowed_tokens=99)
    surface = view.surface([checkpoint])
    request = parse_messages_request(jsonio.dumps(body), KnownMessages())
    forwarded = jsonio.loads(messages_payload(request, surface))["messages"]
    last = next(i for i, n in enumerate(surface.nodes) if n.start == span_end)
    carried = [n.message for n in surface.nodes[: last + 1]]
    chat_body = {
        "model": "claude",
        "max_tokens": cap,
        "messages": [*carried, {"role": "user", "content": INSTRUCTION}],
    }
    prefix = Surface(tuple(surface.nodes[: last + 1]))
    return cache_safe_summary_body(request, prefix, chat_body), forwarded


@pytest.mark.parametrize("breakpoints", [0, 1, 2, 3, 4])
def test_the_cache_safe_call_is_the_forwarded_prefix_then_the_instruction(
    breakpoints: int,
) -> None:
    body = claude_code_session(breakpoints)
    call, forwarded = call_for(body, span_end=5)
    turns = call["messages"]
    assert turns[-1] == {"role": "user", "content": INSTRUCTION}
    carried = turns[:-1]
    # The span may end between two blocks of a turn: its last turn is a head of the one sent.
    *whole, last = unmarked(carried)
    assert whole == unmarked(forwarded[: len(whole)])
    sent = unmarked(forwarded[len(whole)])
    assert last == {**sent, "content": sent["content"][: len(last["content"])]}
    assert len(carried) < len(forwarded)
    assert call["system"] == body["system"] and call["tools"] == body["tools"]
    assert call["model"] == "claude" and call["max_tokens"] == 500
    marks = breakpoints_in(call, turns)
    assert marks <= MAX_BREAKPOINTS
    ends_marked = "cache_control" in str(carried[-1]["content"][-1])
    if not breakpoints:
        assert marks == 0  # a client that does not cache gets no breakpoint of ours
    else:
        assert ends_marked or marks == MAX_BREAKPOINTS


def test_the_call_keeps_the_clients_thinking_and_tool_choice_and_makes_room_for_thinking() -> None:
    body = {
        **claude_code_session(2),
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tool_choice": {"type": "auto"},
        "temperature": 1,
    }
    call, _ = call_for(body, span_end=5, cap=500)
    assert call["thinking"] == body["thinking"] and call["tool_choice"] == body["tool_choice"]
    assert call["max_tokens"] == 500 + 1024
    assert "temperature" not in call and "stream" not in call


@pytest.mark.parametrize(
    ("thinking", "asked", "expected"),
    [
        (None, 200, 500),  # no thinking: the summary's own cap, whatever the client asked
        ({"type": "enabled", "budget_tokens": 1024}, 8192, 1524),
        ({"type": "enabled", "budget_tokens": 1024}, 1200, 1200),  # never more than asked
        ({"type": "adaptive"}, 8192, 1000),
        ({"type": "adaptive"}, None, 1000),
    ],
)
def test_a_thinking_summary_gets_its_budget_on_top_yet_never_more_than_the_client_asked(
    thinking: Any, asked: int | None, expected: int
) -> None:
    body = {"thinking": thinking, "max_tokens": asked}
    assert max_tokens_with_thinking(500, body) == expected


@pytest.mark.parametrize(
    ("thinking", "budget"),
    [
        (None, 0),
        ({"type": "disabled"}, 0),
        ({"type": "enabled", "budget_tokens": 2048}, 2048),
        ({"type": "adaptive"}, None),
        ("enabled", 0),
    ],
)
def test_thinking_takes_its_budget_of_the_calls_max_tokens(
    thinking: Any, budget: int | None
) -> None:
    assert thinking_budget(thinking) == budget


def test_the_rebuilt_call_offers_no_tool_and_carries_no_thinking() -> None:
    body = claude_code_session(2)
    chat = translate_messages(body).messages
    rebuilt = summary_messages_body(
        {
            "model": "claude",
            "max_tokens": 500,
            "messages": [*chat, {"role": "user", "content": INSTRUCTION}],
            "tools": body["tools"],
        }
    )
    assert rebuilt["tool_choice"] == {"type": "none"}
    assert "pondering" not in str(rebuilt["messages"])
    assert rebuilt["messages"][0]["role"] == "user"


@pytest.mark.parametrize(
    ("tool_choice", "cache_safe"),
    [
        ({"type": "auto"}, True),
        ({"type": "none"}, True),
        ({"type": "any"}, False),
        ({"type": "tool", "name": "bash"}, False),
    ],
)
def test_a_client_forcing_a_tool_gets_the_rebuilt_call_at_once(
    tool_choice: dict[str, Any], cache_safe: bool
) -> None:
    call, _ = call_for({**claude_code_session(2), "tool_choice": tool_choice}, span_end=5)
    assert (call is not None) == cache_safe
