"""Hypothesis strategies for what clients send: valid-looking values and junk at every level
the proxy reads."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")  # a module of tests that uses these skips without it

from hypothesis import strategies as st


def texts(size: int) -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8"), max_size=size)


# No NaN or infinity: no JSON parser the proxy uses produces them.
finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | st.integers() | finite | texts(12)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts(6), inner, max_size=3),
    max_leaves=6,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]) | junk
words = texts(60) | st.sampled_from(
    ["x " * 3_000, "<compacted-summary>s</compacted-summary>", "\ud83d\ude00" * 5]
)
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]) | junk},
    optional={"text": words | junk, "image_url": junk, "cache_control": junk},
)
contents = st.none() | words | st.lists(parts | junk, max_size=3) | junk
calls = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["call_0", "", "c1"]) | junk,
        "type": st.just("function") | junk,
        "function": st.fixed_dictionaries({"name": texts(8) | junk, "arguments": texts(30) | junk})
        | junk,
    }
)
messages = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": contents,
        "tool_calls": st.lists(calls, max_size=2) | junk,
        "tool_call_id": st.sampled_from(["call_0", "", "c1"]) | junk,
        "name": texts(8) | junk,
        "function_call": junk,
        "cache_control": junk,
    },
)

# The Responses API's input items, valid-looking and junk.
call_ids = st.sampled_from(["call_0", "c1", ""]) | junk
items = (
    st.fixed_dictionaries(
        {"role": roles}, optional={"type": st.just("message") | junk, "content": contents}
    )
    | st.fixed_dictionaries(
        {"type": st.just("function_call")},
        optional={"call_id": call_ids, "name": texts(8) | junk, "arguments": texts(30) | junk},
    )
    | st.fixed_dictionaries(
        {"type": st.just("function_call_output")},
        optional={"call_id": call_ids, "output": words | junk},
    )
    | st.fixed_dictionaries(
        {"type": st.just("reasoning")},
        optional={"id": texts(6) | junk, "encrypted_content": texts(20) | junk},
    )
    | st.fixed_dictionaries({"type": texts(12) | junk}, optional={"id": junk})
    | junk
)
