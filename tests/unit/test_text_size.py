"""``text_size``: the characters of a JSON value's keys and strings, at any depth."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.conversation.text import text_size

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _counted_one_by_one(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(key) + _counted_one_by_one(item) for key, item in value.items())
    if isinstance(value, list):
        return sum(_counted_one_by_one(item) for item in value)
    return 0


@given(JSON)
def test_text_size_counts_every_key_and_string_at_any_depth(value: Any) -> None:
    assert text_size(value) == _counted_one_by_one(value)


def test_text_size_of_a_tool_call_message() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ],
    }
    keys = len("role") + len("content") + len("tool_calls") + len("idtypefunction")
    keys += len("namearguments")
    assert text_size(message) == keys + len("assistant") + len("c1function") + len("ls{}")
