"""Offsets found by the short cuts are the offsets the token walk finds, and the elements found
between two offsets are the ones a whole parse makes, whatever the bytes."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from compaction_proxy.parsing import json_layout, jsonio
from compaction_proxy.parsing.json_layout import elements_between, layout_of, top_level_array
from tests.strategies import junk, messages, texts

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

STYLES = {
    "compact": lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    ),
    "spaced": lambda v: json.dumps(v).encode(),
    "indented": lambda v: json.dumps(v, indent=1).encode(),
}

# Bytes JSON gives meaning to, and some it does not: what soup is made of.
pieces = st.sampled_from(
    [b"{", b"}", b"[", b"]", b'"', b"\\", b'\\"', b",", b":", b" ", b"\n", b"1", b"true", b"x"]
) | st.sampled_from([b'"messages"', b'"model"', b'"role"', b'"content"', "é".encode()])
soup = st.lists(pieces, max_size=40).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(
    before=st.dictionaries(
        st.sampled_from(["model", "stream", "messages x", "tools", "a\\"]),
        junk | st.just("messages") | st.just('"messages":['),
        max_size=3,
    ),
    style=st.sampled_from(sorted(STYLES)),
)
def test_the_array_is_found_where_the_token_walk_finds_it(
    before: dict[str, Any], style: str
) -> None:
    raw = STYLES[style]({**before, "messages": [{"role": "user", "content": "x"}], "n": 1})
    assert top_level_array(raw, "messages") == json_layout._array_by_tokens(raw, b'"messages"')
    assert top_level_array(raw, "messages") is not None


@pytest.mark.slow  # seconds of examples or waits: the full run has it
@settings(max_examples=1000, deadline=None)
@given(st.tuples(soup, soup).map(lambda p: b"{" + p[0] + b'"messages"' + p[1]))
def test_in_any_bytes_the_array_is_found_where_the_token_walk_finds_it_or_parsing_refuses(
    raw: bytes,
) -> None:
    """Where the two disagree the bytes are not JSON (a parse refuses them): the offset then
    only leads to a parse that fails."""
    found, walked = (
        top_level_array(raw, "messages"),
        json_layout._array_by_tokens(raw, b'"messages"'),
    )
    if found != walked:
        with pytest.raises(ValueError):
            jsonio.loads_fast(raw)


@pytest.mark.slow  # seconds of examples or waits: the full run has it
@settings(max_examples=500, deadline=None)
@given(
    shared=st.lists(messages, min_size=1, max_size=3),
    new=st.lists(messages, max_size=3),
    style=st.sampled_from(sorted(STYLES)),
    extra=texts(5),
)
def test_the_elements_between_two_offsets_are_the_ones_a_whole_parse_makes(
    shared: list[Any], new: list[Any], style: str, extra: str
) -> None:
    raw = STYLES[style]({"messages": [*shared, *new], "x": extra})
    try:
        parsed = jsonio.loads_fast(raw)["messages"]
    except ValueError:
        return  # not UTF-8 (a lone surrogate written raw): no whole parse to compare with
    layout = layout_of(raw, parsed)
    if layout is None:
        return  # an integer orjson cannot write, or a body too odd to lay out
    start, close = layout.ends[len(shared) - 1], layout.closed
    assert close is not None
    found = elements_between(raw, start, close)
    if found is None:
        # Bytes that are not UTF-8, which a whole parse reads (by the standard library's
        # leave) only when an escape elsewhere in the body sends it there.
        with pytest.raises(UnicodeDecodeError):
            raw.decode()
        return
    elements, ends = found
    assert elements == parsed[len(shared) :]
    assert tuple(ends) == layout.ends[len(shared) :]


@pytest.mark.slow  # seconds of examples or waits: the full run has it
@settings(max_examples=1000, deadline=None)
@given(shared=st.lists(messages, min_size=1, max_size=2), garbage=soup)
def test_between_two_offsets_bytes_that_do_not_continue_the_array_give_nothing(
    shared: list[Any], garbage: bytes
) -> None:
    """Whatever stands between the last shared element and the ``]``: the elements found are
    the ones a whole parse of the body makes, or none are."""
    try:
        head = orjson.dumps({"messages": shared})[:-2]  # open array, after its last element
    except TypeError:
        return  # what orjson cannot write (a lone surrogate, a huge integer) is no head here
    raw = head + garbage + b"]}"
    found = elements_between(raw, len(head), len(raw) - 2)
    if found is None:
        return
    try:
        parsed = jsonio.loads_fast(raw)
    except ValueError:
        pytest.fail("elements found in bytes that are not JSON")
    assert found[0] == parsed["messages"][len(shared) :]


@given(
    elements=st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "n"]), texts(3), min_size=1),
        min_size=1,
        max_size=4,
    ),
    gaps=st.lists(st.sampled_from(["", " ", "\n  ", "\t"]), min_size=10, max_size=10),
)
def test_compact_elements_are_found_in_place_whatever_whitespace_lies_between(
    elements: list[dict[str, str]], gaps: list[str]
) -> None:
    """Each element written as orjson writes it, with whitespace around the commas or none:
    found where a scan of the bytes finds it."""
    parts = [gaps[0], "["]
    for index, element in enumerate(elements):
        if index:
            parts += [gaps[2 * index % 10], ","]
        parts += [gaps[(2 * index + 1) % 10], orjson.dumps(element).decode()]
    raw = "".join([*parts, gaps[9], "]"]).encode()
    after_bracket = raw.index(b"[") + 1
    ends = json_layout.ends_by_serialization(raw, after_bracket, elements, after_element=False)
    scanned = json_layout.scan_elements(raw, after_bracket, after_element=False)
    assert scanned is not None
    assert ends == [end for _, end in scanned[0]]
