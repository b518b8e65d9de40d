"""Records are bound to the instructions they were made under, up to volatile details."""

from __future__ import annotations

import re
from typing import Any

import pytest

from compaction_proxy.compaction import request_view
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.conversation.fingerprint import context_fingerprint, normalized_instructions
from tests.builders import system

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

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


@given(st.text(alphabet=st.sampled_from("ab \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2028\u3000")))
def test_whitespace_is_normalized_as_the_regular_expression_did(text: str) -> None:
    """Stored records carry fingerprints: the normalization may get faster, never different."""
    assert normalized_instructions(text) == re.sub(r"\s+", " ", text).strip()


def view_of(head: list[dict[str, Any]], tools: Any = TOOLS) -> RequestView:
    return RequestView.of(
        "tenant", "model", [*head, {"role": "user", "content": "go"}], None, tools
    )


def test_a_context_is_normalized_once_per_process_however_many_requests_carry_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def counted(head: Any, tools: Any) -> str:
        calls.append(1)
        return context_fingerprint(head, tools)

    monkeypatch.setattr(request_view, "context_fingerprint", counted)
    head = [system(BASE + " (once per process)")]
    first, second = view_of(head), view_of([dict(head[0])])
    assert (
        first.context_fingerprint == second.context_fingerprint == fingerprint(head[0]["content"])
    )
    assert len(calls) == 1
    assert view_of(head, tools=None).context_fingerprint == fingerprint(
        BASE + " (once per process)", None
    )
    assert len(calls) == 2


@pytest.mark.parametrize("empty", ["", [], [{"type": "text", "text": ""}]])
def test_a_remembered_fingerprint_tells_a_null_instruction_from_an_empty_one(empty: Any) -> None:
    """Canonical messages drop null and empty content alike; the fingerprint does not."""
    null_head = [{"role": "system", "content": None}]
    empty_head = [{"role": "system", "content": empty}]
    assert view_of(null_head).context_digest == view_of(empty_head).context_digest
    assert view_of(null_head).context_fingerprint == context_fingerprint(null_head, TOOLS)
    assert view_of(empty_head).context_fingerprint == context_fingerprint(empty_head, TOOLS)
    assert view_of(null_head).context_fingerprint != view_of(empty_head).context_fingerprint


def test_tools_are_hashed_once_per_parsed_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body parsed from a remembered one shares its tools object: the digest is reused for
    that object, and an equal object parsed anew gets the same digest."""
    serialized: list[Any] = []
    dumps = request_view.jsonio.dumps

    def counted(value: Any, **options: Any) -> bytes:
        if value == tools:  # messages are serialized too (their digests)
            serialized.append(value)
        return dumps(value, **options)

    tools = [{"type": "function", "function": {"name": "once", "parameters": {}}}]
    monkeypatch.setattr(request_view.jsonio, "dumps", counted)
    first, second = view_of([system()], tools), view_of([system()], tools)
    assert first.tools_digest == second.tools_digest
    assert serialized == [tools]
    copy = [dict(tools[0])]
    assert view_of([system()], copy).tools_digest == first.tools_digest
    assert len(serialized) == 2
