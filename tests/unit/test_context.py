"""Records are bound to the instructions they were made under, up to volatile details."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.context import context_fingerprint
from tests.builders import system

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
BASE = (
    "You are a coding agent. Today is Monday, November 30, 2026, 22:17 UTC. "
    "Session 3f2a9c1e-1b2c-4d5e-8f90-123456789abc (run a1b2c3d4e5f6a7b8)."
)


def fingerprint(text: str, tools: Any = TOOLS) -> str:
    return context_fingerprint([system(text)], tools)


@pytest.mark.parametrize(
    "dynamic",
    [
        BASE.replace("Monday, November 30", "Tuesday, December 1"),
        BASE.replace("2026, 22:17", "2027, 09:05"),
        BASE.replace(
            "3f2a9c1e-1b2c-4d5e-8f90-123456789abc", "00000000-1111-2222-3333-444444444444"
        ),
        BASE.replace("a1b2c3d4e5f6a7b8", "ffee00112233aabb"),
        BASE.replace("Today is", "Today  is\n"),
        [{"type": "text", "text": BASE}],
    ],
)
def test_dates_ids_and_whitespace_in_the_instructions_keep_the_context(dynamic: Any) -> None:
    head = [{"role": "system", "content": dynamic}]
    assert context_fingerprint(head, TOOLS) == fingerprint(BASE)


@pytest.mark.parametrize(
    ("text", "tools"),
    [
        (BASE.replace("coding agent", "travel agent"), TOOLS),
        (BASE + " Never run tests.", TOOLS),
        (BASE, None),
        (BASE, [{**TOOLS[0], "function": {"name": "python", "parameters": {}}}]),
    ],
)
def test_another_instruction_or_tool_set_is_another_context(text: str, tools: Any) -> None:
    assert fingerprint(text, tools) != fingerprint(BASE)


def test_a_developer_message_is_not_the_same_instruction_as_a_system_one() -> None:
    as_developer = context_fingerprint([{"role": "developer", "content": BASE}], TOOLS)
    assert as_developer != fingerprint(BASE)
