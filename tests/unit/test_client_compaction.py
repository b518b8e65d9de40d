"""An agent's own summarization request, told by its prompt (pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from compaction_proxy.conversation import client_compaction
from compaction_proxy.conversation.client_compaction import (
    KNOWN_PROMPTS,
    is_client_compaction,
    is_continued_history,
)

pytest.importorskip("hypothesis")

from hypothesis import example, given, settings
from hypothesis import strategies as st

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
CODEX = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another "
    "LLM that will resume the task."
)
CLAUDE_CODE = (
    "Your task is to create a detailed summary of the conversation so far, paying close "
    "attention to the user's explicit requests and your previous actions."
)
OPENCODE = "Provide a detailed prompt for continuing our conversation above."
OPENCODE_1_18 = (
    "Here is the conversation so far:\n\n<conversation>\n[User]: Print each data file.\n"
    "[Assistant tool call]: bash(...)\n</conversation>\n\nSummarize it in this template: ..."
)


def body(last: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Fix the importer."},
        {"role": "assistant", "content": "Looking."},
        {"role": "user", "content": last},
    ]


@pytest.mark.parametrize(
    ("last", "tools", "compacting"),
    [
        (CODEX, None, True),
        ([{"type": "text", "text": CODEX}], None, True),  # parts (Responses, Messages)
        (CLAUDE_CODE, TOOLS, True),  # a known prompt, tools offered or not
        (OPENCODE, None, True),
        (OPENCODE_1_18, None, True),
        ("Please summarize the conversation so far for a handoff.", None, True),
        ("Please summarize the conversation so far for a handoff.", TOOLS, False),
        ("Summarize this file for me.", None, False),
        ("Run the tests.", None, False),
        ("Run the tests.", TOOLS, False),
    ],
)
def test_a_summarization_request_is_told_by_its_prompt_and_tools(
    last: Any, tools: Any, compacting: bool
) -> None:
    assert is_client_compaction(body(last), tools) is compacting


def test_only_the_last_user_turn_counts() -> None:
    history = [*body(CODEX), {"role": "assistant", "content": "Summary."}]
    history.append({"role": "user", "content": "Go on with the next file."})
    assert not is_client_compaction(history, None)


def test_a_request_closing_with_a_tools_result_is_the_tool_loop_not_a_summarization() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    history = [*body(CODEX), {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    assert not is_client_compaction(history, TOOLS)  # the ask was counted when it was new
    assert not is_client_compaction([], None)


@pytest.mark.parametrize(
    ("opening", "continued"),
    [
        ("Another language model started to solve this problem and produced a summary", True),
        ("This session is being continued from a previous conversation that ran out", True),
        ("Let me continue from where we were.", False),
    ],
)
def test_a_history_rebuilt_from_an_agents_summary_is_told_by_its_opening(
    opening: str, continued: bool
) -> None:
    history = [
        {"role": "user", "content": "Fix the importer."},
        {"role": "user", "content": opening},
    ]
    assert is_continued_history(history) is continued
    assert not is_continued_history([{"role": "user", "content": "Fix it."}] * 9 + history[1:])


_FRAGMENTS = [
    "Summarize",
    "SUMMARY of",
    "recap",
    "Condense",
    " the ",
    "conversation",
    "HISTORY",
    "work so far",
    "chat",
    ".",
    "\n",
    " ",
    "x" * 90,
    "Recap the conversation",
    "please condense this chat",
    "İ",
    "\u212a",
    "\u017f",  # a long s: the expressions take it for an s
    "\u0131",  # a dotless i: the expressions take it for an i
    *(prompt.upper() for prompt in KNOWN_PROMPTS),
    *(prompt[: len(prompt) // 2] for prompt in KNOWN_PROMPTS),
]


def reference(last: str, tools: Any) -> bool:
    """The definition, as one case-insensitive expression per test (slow on long turns)."""
    known = re.compile("|".join(re.escape(p) for p in KNOWN_PROMPTS), re.IGNORECASE)
    text = last[:4096]
    return bool(known.search(text)) or (not tools and bool(client_compaction._ASKS.search(text)))


@settings(max_examples=500, deadline=None)
@example("İSummarize:0Recap the conversation", False)  # lowering moves a word boundary
@example("\u017fummarize the conversation", False)  # folds more than lower() does
@given(
    st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=6), max_size=6).map("".join),
    st.booleans(),
)
def test_the_quick_look_at_the_last_user_turn_decides_as_the_expressions_do(
    last: str, with_tools: bool
) -> None:
    tools = TOOLS if with_tools else None
    assert is_client_compaction(body(last), tools) == reference(last, tools)
