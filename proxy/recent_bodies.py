"""Chat bodies that extend one this process parsed a moment ago, parsed from where they differ.

An agent resends its whole history on every request, byte for byte as it sent it before, with
the new messages appended. Parsing the whole body, and looking every message up by its bytes
(``known_messages``), costs time in proportion to the history. So the layout of each parsed body
is remembered: where its ``messages`` array (a Responses body's ``input``) opens and where each
element ends. A body whose bytes start with a remembered body's bytes up to the end of one of
its elements takes those elements, their digests, and what the API's adapter made of them, as
they are, and only the rest is parsed:

* the new messages, each parsed alone, between offsets found by a string-aware scan of the tail
  (strings are skipped whole by one regular expression, so a long tool output costs no Python
  per character);
* the rest of the object, parsed with the array's contents replaced by a per-process nonce, so a
  second ``messages`` key (parsers keep the last) is noticed.

Invariants:

* ``extend`` returns the body a whole parse (``jsonio.loads_fast``) returns, or None, and then the
  caller parses the whole body, which also words any error.
* Messages handed out are the same objects for every body sharing them: nothing may modify a
  parsed message (nothing in the proxy does; the core works on copies).
* The bytes held are bounded (``max_bytes``, counting a body four times over for its parsed
  messages and its chain; least recently used first out).
* A remembered body also keeps its body chain once a request view has hashed it
  (``KnownChains``), so the next body's chain is hashed from where the two differ.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy import jsonio

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
_PARSED_COST = 4  # a body's parsed messages, as a multiple of its bytes
_PER_KEY = 4  # bodies remembered under one opening (forks, replays)
_MAX_DEPTH = 512  # well inside orjson's nesting limit, counted from the top of the body


@dataclass(frozen=True)
class Layout:
    """Where a body's array (``messages``, ``input``) opens (just after ``[``) and each
    element ends."""

    opened: int
    ends: tuple[int, ...]


@dataclass(frozen=True, eq=False)  # compared by identity: a body is one remembered parse
class _Remembered:
    raw: bytes
    layout: Layout
    elements: tuple[Any, ...]  # the array's elements as parsed
    digests: tuple[str, ...]  # of the chat messages the elements stand for
    translation: Any  # what the API's adapter made of the elements (None for chat)
    # The body chain of these messages, by tenant root, once a request view has hashed it.
    chains: dict[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownChains:
    """What a body's chain can start from: the chains of the remembered body it extends (by
    tenant root) for the ``shared`` messages, head included, the two have in common; and where
    this body's own chains are left for the body that extends it next."""

    earlier: Mapping[str, Sequence[str]]
    shared: int
    own: dict[str, Sequence[str]]

    def known(self, root: str, head: int) -> Sequence[str]:
        """The chain of the shared body positions, for a head of ``head`` messages. Messages
        past the head are shared only if the remembered body split its head at the same
        place (the same bytes up to there), so its positions are ours."""
        return self.earlier.get(root, ())[: max(0, self.shared - head)]


@dataclass(frozen=True)
class Extension:
    """A body parsed from a remembered one: its array is the whole list, of which the first
    ``known`` elements come from the remembered body (``base``)."""

    body: dict[str, Any]
    known: int
    layout: Layout
    base: _Remembered
    key: int  # the bucket both are filed under (the same first two messages)


def _space(raw: bytes, pos: int) -> int:
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


def top_level_array(raw: bytes, name: str) -> int | None:
    """The offset just after the ``[`` of the top-level array ``name``, if there is one."""
    quoted = f'"{name}"'.encode()
    depth = 0
    for start, end in _tokens(raw, 0):
        first = raw[start]
        if first == _QUOTE:
            if depth == 1 and raw[start:end] == quoted:
                colon = _space(raw, end)
                if raw[colon : colon + 1] == b":":
                    bracket = _space(raw, colon + 1)
                    return bracket + 1 if raw[bracket : bracket + 1] == b"[" else None
            continue
        depth += 1 if first in _OPEN else -1
    return None


def _object_end(raw: bytes, start: int) -> int | None:
    depth = 0
    for token, end in _tokens(raw, start):
        first = raw[token]
        if first == _QUOTE:
            continue
        depth += 1 if first in _OPEN else -1
        if depth == 0:
            return end
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
        pos = _space(raw, pos)
        if raw[pos : pos + 1] == b"]":
            return spans, pos
        if after_element:
            if raw[pos : pos + 1] != b",":
                return None
            pos = _space(raw, pos + 1)
        if raw[pos : pos + 1] != b"{":
            return None
        end = _object_end(raw, pos)
        if end is None:
            return None
        spans.append((pos, end))
        pos, after_element = end, True
    return spans, None


def layout_of(raw: bytes, elements: Sequence[Any], name: str = "messages") -> Layout | None:
    """The layout of a body whose array ``name`` parsed whole into ``elements``: each
    element's own serialization found in place (most clients write compact JSON as orjson
    does), else, for a small body, a scan; None when neither works."""
    opened = top_level_array(raw, name)
    if opened is None or not elements:
        return None
    ends: list[int] = []
    pos = opened
    try:
        for index, element in enumerate(elements):
            pos = _space(raw, pos)
            if index:
                if raw[pos : pos + 1] != b",":
                    break
                pos = _space(raw, pos + 1)
            written = orjson.dumps(element)
            if not raw.startswith(written, pos):
                break
            pos += len(written)
            ends.append(pos)
        else:
            return Layout(opened, tuple(ends))
    except TypeError:  # orjson cannot write it (an integer beyond 64 bits)
        pass
    if len(raw) > SCAN_LIMIT:
        return None
    scanned = scan_elements(raw, opened, after_element=False)
    if scanned is None or len(scanned[0]) != len(elements):
        return None
    return Layout(opened, tuple(end for _, end in scanned[0]))


def _key(raw: bytes, layout_ends: Sequence[int]) -> int:
    """Bodies are filed under their bytes up to the end of the second message (or the first):
    the system prompt and the task, which tell most conversations apart. Python's own hash of
    them: a bucket only says where to look (the bytes themselves are compared), and this one
    costs a fifth of a cryptographic digest. (Of a copy: hashing a memoryview hashes the
    whole body it views first.)"""
    return hash(raw[: layout_ends[min(1, len(layout_ends) - 1)]])


class RecentBodies:
    """Bounded memory of recently parsed chat bodies; safe from the event loop and worker
    threads at once (a big body is parsed off the loop)."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        self.max_bytes = max_bytes
        self._by_key: OrderedDict[int, list[_Remembered]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._nonce = secrets.token_hex(16)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def extend(self, raw: bytes, name: str = "messages") -> Extension | None:
        """The body parsed from a remembered body its array ``name`` extends, or None (parse
        it whole)."""
        if not self.enabled:
            return None
        opened = top_level_array(raw, name)
        if opened is None:
            return None
        opening = scan_elements(raw, opened, after_element=False, limit=2)
        if opening is None or not opening[0]:
            return None
        key = _key(raw, [end for _, end in opening[0]])
        with self._lock:
            candidates = list(self._by_key.get(key, ()))
            if candidates:
                self._by_key.move_to_end(key)
        for base in candidates:
            known = _shared_messages(raw, base)
            if known:
                return self._parse_rest(raw, base, known, key, name)
        return None

    def _parse_rest(
        self, raw: bytes, base: _Remembered, known: int, key: int, name: str
    ) -> Extension | None:
        ends = base.layout.ends[:known]
        scanned = scan_elements(raw, ends[-1], after_element=True)
        if scanned is None or scanned[1] is None:
            return None
        spans, closed = scanned
        opened = base.layout.opened
        nonce = f'"{self._nonce}"'.encode()
        try:
            new = [jsonio.loads_fast(raw[start:end]) for start, end in spans]
            rest = jsonio.loads_fast(b"".join((raw[:opened], nonce, raw[closed:])))
        except (ValueError, RecursionError):
            return None
        if not isinstance(rest, dict) or rest.get(name) != [self._nonce]:
            return None  # not an object, or a second key of that name wins
        rest[name] = [*base.elements[:known], *new]
        layout = Layout(opened, (*ends, *(end for _, end in spans)))
        return Extension(rest, known, layout, base, key)

    def remember(
        self,
        raw: bytes,
        elements: Sequence[Any],
        digests: Sequence[str],
        name: str = "messages",
        replaces: Extension | None = None,
        translation: Any = None,
        shared: int | None = None,
    ) -> KnownChains | None:
        """Remember a body whose array ``name`` was parsed into ``elements`` (``replaces``: the
        extension it was parsed as, whose base it supersedes; ``translation``: what the API's
        adapter made of the elements). Returns where the body's chains go, and any it can
        start from: those of the ``shared`` leading messages it has in common with the base
        (by default, its known elements); None when disabled or when a body parsed whole
        cannot be laid out."""
        if not self.enabled:
            return None
        earlier = {} if replaces is None else replaces.base.chains
        if shared is None:
            shared = 0 if replaces is None else replaces.known
        cost = len(raw) * _PARSED_COST
        if cost * 10 > self.max_bytes:
            return KnownChains(earlier, shared, {})  # too big to keep: spare the layout
        layout = replaces.layout if replaces is not None else layout_of(raw, elements, name)
        if layout is None:
            return None
        if len(layout.ends) != len(elements):
            return KnownChains(earlier, shared, {})
        entry = _Remembered(raw, layout, tuple(elements), tuple(digests), translation)
        key = replaces.key if replaces is not None else _key(raw, layout.ends)
        with self._lock:
            bucket = self._by_key.setdefault(key, [])
            self._by_key.move_to_end(key)
            if replaces is not None and replaces.base in bucket:
                bucket.remove(replaces.base)
                self._bytes -= len(replaces.base.raw) * _PARSED_COST
            bucket.insert(0, entry)
            self._bytes += cost
            while len(bucket) > _PER_KEY:
                self._bytes -= len(bucket.pop().raw) * _PARSED_COST
            while self._bytes > self.max_bytes and self._by_key:
                _, evicted = self._by_key.popitem(last=False)
                self._bytes -= sum(len(e.raw) for e in evicted) * _PARSED_COST
        return KnownChains(earlier, shared, entry.chains)


def _shared_messages(raw: bytes, base: _Remembered) -> int:
    """How many of ``base``'s messages ``raw`` repeats byte for byte, from its first byte."""
    ends = base.layout.ends
    view = memoryview(base.raw)
    if raw.startswith(view[: ends[-1]]):
        return len(ends)
    low, high = 0, len(ends) - 1  # invariant: the first `low` messages are shared
    while low < high:
        middle = (low + high + 1) // 2
        if raw.startswith(view[: ends[middle - 1]]):
            low = middle
        else:
            high = middle - 1
    return low
