"""An agent's own summarization request, told by its prompt (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.conversation.client_compaction import (
    is_client_compaction,
    is_continued_history,
)

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
