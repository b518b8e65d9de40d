"""Where things are in the bytes of a JSON body, found without parsing it.

The proxy remembers the bodies it parsed (``parsing.recent_bodies``) and needs, for a new body,
only a few offsets: where its ``messages`` array (a Responses body's ``input``) opens, where its
elements end, where it closes. These functions find them with byte searches and regular
expressions, so a long string costs no Python per character.

Invariants:

* Every offset returned is where a whole parse would put it, or the function returns None (it
  never guesses). Bytes that are not JSON get None, or offsets whose elements a parse then
  refuses: nothing here validates, the parse that follows does.
* Nothing here holds state; the functions are pure over ``bytes``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import orjson

from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio

_STRUCTURE = re.compile(rb'["\[\]{}]')  # where a string or a bracket starts
# A whole JSON string, escapes included (a backslash escapes any byte, as in string_end).
JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SPACE = re.compile(rb"[ \t\r\n]*")
_OPEN = frozenset(b"[{")
_QUOTE = ord('"')
_BACKSLASH = ord("\\")
_SHORT_RUN = 16  # backslashes counted one by one before a quote
# A body met without a remembered one is scanned for its layout only up to this size (a bigger
# one is laid out by matching each message's own serialization, or not at all).
SCAN_LIMIT = 64 * 1024
_MAX_DEPTH = 512  # well inside orjson's nesting limit, counted from the top of the body


@frozen
class Layout:
    """Where a body's array (``messages``, ``input``) opens (just after ``[``), where each
    element ends, and where it closes (the offset of its ``]``; None when not known)."""

    opened: int
    ends: Sequence[int]
    closed: int | None = None


def space(raw: bytes, pos: int) -> int:
    """The offset of the first byte from ``pos`` that is not JSON whitespace."""
    match = _SPACE.match(raw, pos)
    return match.end() if match else pos


def string_end(raw: bytes, start: int) -> int | None:
    """The offset just past the JSON string whose quote opens at ``start``; None if it never
    closes. Its end is the first quote after an even run of backslashes, found at the speed of
    a byte search; only a long run of backslashes is left to the escape-aware expression."""
    close = raw.find(b'"', start + 1)
    while close >= 0:
        run = 0  # backslashes right before the quote (the opening quote stops the count)
        while raw[close - 1 - run] == _BACKSLASH:
            run += 1
            if run > _SHORT_RUN:
                match = JSON_STRING.match(raw, start)
                return match.end() if match else None
        if run % 2 == 0:
            return close + 1
        close = raw.find(b'"', close + 1)
    return None


def _tokens(raw: bytes, pos: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of each string and bracket from ``pos``, in order; ends early at a
    string that never closes."""
    search = _STRUCTURE.search
    while (found := search(raw, pos)) is not None:
        start = found.start()
        if raw[start] == _QUOTE:
            end = string_end(raw, start)
            if end is None:
                return
        else:
            end = start + 1
        yield start, end
        pos = end


def _array_after_key(raw: bytes, key_end: int) -> int | None:
    """Just after the ``[`` that follows the key ending at ``key_end`` (a colon between)."""
    colon = space(raw, key_end)
    if raw[colon : colon + 1] != b":":
        return None
    bracket = space(raw, colon + 1)
    return bracket + 1 if raw[bracket : bracket + 1] == b"[" else None


def top_level_array(raw: bytes, name: str) -> int | None:
    """The offset just after the ``[`` of the top-level array ``name``, if there is one."""
    quoted = f'"{name}"'.encode()
    # Most bodies name the array early, after a few plain members (``"model":"..."``): when
    # nothing before the first occurrence opens or closes a container or escapes a quote,
    # and its quotes pair up, that occurrence stands in the top-level object, outside any
    # string (its key, when a colon and a bracket follow).
    found = raw.find(quoted)
    if found > 0:
        before = raw[:found]
        plain = before.count(b"{") == 1 and before.count(b'"') % 2 == 0
        plain = plain and b"}" not in before and b"[" not in before and b"\\" not in before
        if plain and before.lstrip(b" \t\r\n")[:1] == b"{":
            opened = _array_after_key(raw, found + len(quoted))
            if opened is not None:
                return opened  # else it was a value, or no array follows: walk the tokens
    return _array_by_tokens(raw, quoted)


def _array_by_tokens(raw: bytes, quoted: bytes) -> int | None:
    depth = 0
    for start, end in _tokens(raw, 0):
        first = raw[start]
        if first == _QUOTE:
            if depth == 1 and raw[start:end] == quoted:
                opened = _array_after_key(raw, end)
                if opened is not None:
                    return opened  # else a value of that text, or a key of no array
            continue
        depth += 1 if first in _OPEN else -1
    return None


def _object_end(raw: bytes, start: int) -> int | None:
    # ``_tokens``, inlined: this runs for every message a body is scanned for (a generator's
    # resumption per token cost a third of it).
    search = _STRUCTURE.search
    depth, pos = 0, start
    while (found := search(raw, pos)) is not None:
        at = found.start()
        first = raw[at]
        if first == _QUOTE:
            end = string_end(raw, at)
            if end is None:
                return None
            pos = end
            continue
        pos = at + 1
        depth += 1 if first in _OPEN else -1
        if depth == 0:
            return pos
        if depth > _MAX_DEPTH:
            return None  # what a whole parse may refuse is left to it
    return None


def scan_elements(
    raw: bytes, pos: int, after_element: bool, limit: int | None = None
) -> tuple[list[tuple[int, int]], int | None] | None:
    """The (start, end) of each object element from ``pos`` (``after_element``: a ``,`` comes
    first), and the offset of the array's ``]``; None where the bytes are not such an array
    (a whole parse words the error). With ``limit``, stops after that many elements (no
    ``]`` then)."""
    spans: list[tuple[int, int]] = []
    while limit is None or len(spans) < limit:
        pos = space(raw, pos)
        if raw[pos : pos + 1] == b"]":
            return spans, pos
        if after_element:
            if raw[pos : pos + 1] != b",":
                return None
            pos = space(raw, pos + 1)
        if raw[pos : pos + 1] != b"{":
            return None
        end = _object_end(raw, pos)
        if end is None:
            return None
        spans.append((pos, end))
        pos, after_element = end, True
    return spans, None


def ends_by_serialization(
    raw: bytes, pos: int, elements: Sequence[Any], after_element: bool
) -> list[int] | None:
    """Where each of ``elements`` ends, if they are written from ``pos`` on as orjson writes
    them (compact, as most clients write): each element's own bytes found in place; None
    otherwise."""
    ends: list[int] = []
    startswith = raw.startswith
    try:
        for element in elements:
            # Whitespace is looked for only where the compact form is not found: most bodies
            # have none, and each element would otherwise cost two searches.
            if after_element:
                if not startswith(b",", pos):
                    pos = space(raw, pos)
                    if not startswith(b",", pos):
                        return None
                pos += 1
            written = orjson.dumps(element)
            if not startswith(written, pos):
                pos = space(raw, pos)
                if not startswith(written, pos):
                    return None
            pos += len(written)
            ends.append(pos)
            after_element = True
    except TypeError:  # orjson cannot write it (an integer beyond 64 bits)
        return None
    return ends


def layout_of(raw: bytes, elements: Sequence[Any], name: str = "messages") -> Layout | None:
    """The layout of a body whose array ``name`` parsed whole into ``elements``: each
    element's own serialization found in place (most clients write compact JSON as orjson
    does), else, for a small body, a scan; None when neither works."""
    opened = top_level_array(raw, name)
    if opened is None or not elements:
        return None
    ends = ends_by_serialization(raw, opened, elements, after_element=False)
    if ends is not None:
        closed = space(raw, ends[-1])
        return Layout(opened, tuple(ends), closed if raw[closed : closed + 1] == b"]" else None)
    if len(raw) > SCAN_LIMIT:
        return None
    scanned = scan_elements(raw, opened, after_element=False)
    if scanned is None or len(scanned[0]) != len(elements):
        return None
    spans, closed_at = scanned
    return Layout(opened, tuple(end for _, end in spans), closed_at)


def elements_between(raw: bytes, start: int, close: int) -> tuple[list[Any], list[int]] | None:
    """The elements an array holds after an element ending at ``start``, up to its ``]`` at
    ``close``, each parsed, and where each ends; None when the bytes between are not such
    elements (a ``,`` before each, an object each) or cannot be laid out.

    Parsed in one call, as the inside of ``[[`` … ``]]``: the same nesting depth as in the body,
    and a single inner array exactly when the bytes continue the array and no more."""
    pos = space(raw, start)
    if pos == close:
        return [], []
    if raw[pos : pos + 1] != b",":
        return None
    try:
        parsed = jsonio.loads_fast(b"".join((b"[[", raw[pos + 1 : close], b"]]")))
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, list) or len(parsed) != 1 or not parsed[0]:
        return None
    elements: list[Any] = parsed[0]
    if not all(map(isinstance, elements, repeat(dict))):
        return None  # a whole parse words the error
    ends = ends_by_serialization(raw, start, elements, after_element=True)
    if ends is None:
        scanned = scan_elements(raw, start, after_element=True)
        if scanned is None or scanned[1] != close or len(scanned[0]) != len(elements):
            return None
        ends = [end for _, end in scanned[0]]
    return elements, ends
