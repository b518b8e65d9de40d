"""Chat bodies that extend one this process parsed a moment ago, parsed from where they differ.

An agent resends its whole history on every request, byte for byte as it sent it before, with
the new messages appended. Parsing the whole body, and looking every message up by its bytes
(``known_messages``), costs time in proportion to the history. So the layout of each parsed body
is remembered: where its ``messages`` array (a Responses body's ``input``) opens and where each
element ends. A body whose bytes start with a remembered body's bytes up to the end of one of
its elements takes those elements, their digests, and what the API's adapter made of them, as
they are, and only the rest is parsed:

* when the body ends with the bytes the remembered one ended with after its array, and that
  one's other members are known (it was itself an extension): the new messages alone, in one
  parse, and the other members taken as they were;
* otherwise the new messages, each parsed alone, between offsets found by a string-aware scan
  of the tail (``parsing.json_layout``), and the rest of the object, parsed with the array's
  contents replaced by a per-process nonce, so a second ``messages`` key (parsers keep the
  last) is noticed.

Invariants:

* ``extend`` returns the body a whole parse (``jsonio.loads_fast``) returns, or None, and then the
  caller parses the whole body, which also words any error.
* Messages handed out are the same objects for every body sharing them, and so are the values
  of the other members: nothing may modify a parsed body (nothing in the proxy does; the core
  works on copies).
* The bytes held are bounded (``max_bytes``, counting a body four times over for its parsed
  messages and its chain; least recently used first out).
* A remembered body also keeps its body chain once a request view has hashed it
  (``Lineage``), so the next body's chain is hashed from where the two differ.

A client that names its conversation (``X-Session-Id``) names the body it extends too: the
name leads to the bucket of its conversation's last body, and a body that repeats that one's
first two messages belongs in that bucket, so neither the array nor the opening messages are
looked for. A name only says where to look first: the bytes decide, and a body that does not
extend what its name leads to is looked up as any other (a client that sends one name for
every conversation costs a wasted comparison, never a wrong parse).
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio
from compaction_proxy.parsing.json_layout import (
    Layout,
    elements_between,
    layout_of,
    scan_elements,
    top_level_array,
)

T = TypeVar("T")

_PARSED_COST = 4  # a body's parsed messages, as a multiple of its bytes
_PER_KEY = 4  # bodies remembered under one opening (forks, replays)
_MAX_HINTS = 16_384  # conversation names remembered (each leads to a bucket)


@dataclass
class Scanned:
    """What a scan of a remembered body for integers beyond 64 bits found
    (``jsonio.may_hold_a_big_integer``): ``clean`` once a request scanned the whole body and
    found none. Only a request that rewrites its body scans it, every such request of a
    compacted conversation, and the body is the client's whole history."""

    clean: bool = False
    # What the edge's scan for decision keys found in this body, with where (kept for the next
    # body that extends it, which then scans only its new bytes: security.object_references).
    keys: object | None = None


@frozen(eq=False)  # compared by identity: a body is one remembered parse
class _Remembered:
    raw: bytes
    layout: Layout
    # The array's elements as parsed, and the digests of the chat messages they stand for:
    # the very lists the request was given (nothing modifies a parsed body).
    elements: Sequence[Any]
    digests: Sequence[str]
    translation: Any  # what the API's adapter made of the elements (None for chat)
    # The body as parsed, when its other members are known to be what a whole parse makes
    # of them (its array the one a whole parse keeps): a body that repeats its bytes after
    # the array shares them. None for a body parsed whole (its first extension checks).
    rest: dict[str, Any] | None = None
    # The body chain of these messages, by tenant root, once a request view has hashed it.
    chains: dict[str, Sequence[str]] = field(default_factory=dict)
    scanned: Scanned = field(default_factory=Scanned)


@frozen
class Lineage:
    """What a body takes from the remembered body it extends, and leaves for the next one.

    Its chain can start from the remembered body's chains (by tenant root) for the ``shared``
    messages, head included, the two have in common; ``own`` is where this body's chains are
    left. Its first ``clean_bytes`` bytes are those it shares with a remembered body a scan
    found clean, so its own scan starts there (the shared bytes end with a message's closing
    brace: no run of digits crosses that point); ``scanned`` is where its own scans are left
    (None for a body not remembered), ``base_scanned`` where the remembered body's are."""

    earlier: Mapping[str, Sequence[str]]
    shared: int
    own: dict[str, Sequence[str]]
    clean_bytes: int = 0
    scanned: Scanned | None = None
    # The remembered body's own scan, and how many first bytes this one shares with it (up to
    # a message's closing brace, so no key or escape crosses that point).
    base_scanned: Scanned | None = None
    shared_bytes: int = 0

    def known(self, root: str, head: int) -> Sequence[str]:
        """The chain of the shared body positions, for a head of ``head`` messages. Messages
        past the head are shared only if the remembered body split its head at the same
        place (the same bytes up to there), so its positions are ours."""
        earlier = self.earlier.get(root, ())
        count = max(0, self.shared - head)
        return earlier if count >= len(earlier) else earlier[:count]


@frozen
class Extension:
    """A body parsed from a remembered one: its array is the whole list, of which the first
    ``known`` elements come from the remembered body (``base``)."""

    body: dict[str, Any]
    known: int
    layout: Layout
    base: _Remembered
    key: int  # the bucket both are filed under (the same first two messages)


def first_of(items: Sequence[T], count: int, *more: Iterable[T]) -> list[T]:
    """``[*items[:count], *more...]`` in one copy of the shared items. Every request copies
    its history's messages, digests and message ends from the body it extends; a copy and
    then another would touch each of them twice (their reference counts: objects a request
    ago, often out of the core's caches by now). A list's slice is that one copy, and five
    times as quick as copying through ``islice`` (a Messages body, whose last turn moved its
    breakpoint, copies all but the last of each list on every request)."""
    if count >= len(items):
        out = list(items)
    else:
        shared = items[:count]
        out = shared if isinstance(shared, list) else list(shared)
    for extra in more:
        out.extend(extra)
    return out


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
        # (array name, the client's conversation name) -> the bucket of its last body
        self._by_hint: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._nonce = secrets.token_hex(16)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def extend(
        self, raw: bytes, name: str = "messages", hint: str | None = None
    ) -> Extension | None:
        """The body parsed from a remembered body its array ``name`` extends, or None (parse
        it whole). ``hint``: the client's name for the conversation, when it gave one."""
        if not self.enabled:
            return None
        if hint is not None:
            hinted = self._extend_hinted(raw, name, hint)
            if hinted is not None:
                return hinted
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

    def _extend_hinted(self, raw: bytes, name: str, hint: str) -> Extension | None:
        """The body extended from the bucket its conversation's name leads to. A base whose
        first two messages the body repeats is filed under the key the body's own opening
        gives: the bucket is the one a lookup by opening finds, so a name never changes where
        a body is filed. Its array opens where the base's does (the bytes before it are the
        same)."""
        with self._lock:
            key = self._by_hint.get((name, hint))
            if key is None:
                return None
            candidates = list(self._by_key.get(key, ()))
            if candidates:
                self._by_key.move_to_end(key)
        for base in candidates:
            known = _shared_messages(raw, base)
            if known >= 2:  # a one-message base's key covers less than the body's
                return self._parse_rest(raw, base, known, key, name)
        return None

    def _parse_rest(
        self, raw: bytes, base: _Remembered, known: int, key: int, name: str
    ) -> Extension | None:
        start = base.layout.ends[known - 1]
        parsed = _rest_by_suffix(raw, base, start) or self._rest_by_scan(raw, base, start, name)
        if parsed is None:
            return None
        body, new, new_ends, closed = parsed
        body[name] = first_of(base.elements, known, new)
        layout = Layout(base.layout.opened, first_of(base.layout.ends, known, new_ends), closed)
        return Extension(body, known, layout, base, key)

    def _rest_by_scan(self, raw: bytes, base: _Remembered, start: int, name: str) -> _Rest | None:
        """The elements after ``start`` found by a scan, each parsed alone, and the other
        members parsed with the array's contents replaced by the nonce."""
        scanned = scan_elements(raw, start, after_element=True)
        if scanned is None:
            return None
        spans, closed = scanned
        if closed is None:
            return None
        nonce = f'"{self._nonce}"'.encode()
        try:
            new = [jsonio.loads_fast(raw[begin:end]) for begin, end in spans]
            rest = jsonio.loads_fast(b"".join((raw[: base.layout.opened], nonce, raw[closed:])))
        except (ValueError, RecursionError):
            return None
        if not isinstance(rest, dict) or rest.get(name) != [self._nonce]:
            return None  # not an object, or a second key of that name wins
        return rest, new, [end for _, end in spans], closed

    def remember(
        self,
        raw: bytes,
        elements: Sequence[Any],
        digests: Sequence[str],
        name: str = "messages",
        replaces: Extension | None = None,
        translation: Any = None,
        shared: int | None = None,
        hint: str | None = None,
    ) -> Lineage | None:
        """Remember a body whose array ``name`` was parsed into ``elements`` (``replaces``: the
        extension it was parsed as, whose base it supersedes; ``translation``: what the API's
        adapter made of the elements). Returns where the body's chains go, and any it can
        start from: those of the ``shared`` leading messages it has in common with the base
        (by default, its known elements); None when disabled or when a body parsed whole
        cannot be laid out. ``hint``: the client's name for the conversation (the next body
        under that name is looked for here first)."""
        if not self.enabled:
            return None
        earlier = {} if replaces is None else replaces.base.chains
        if shared is None:
            shared = 0 if replaces is None else replaces.known
        clean = _clean_bytes(raw, replaces)
        base_scanned = None if replaces is None else replaces.base.scanned
        shared_bytes = _shared_bytes(raw, replaces)
        cost = len(raw) * _PARSED_COST
        if cost * 10 > self.max_bytes:
            # Too big to keep: spare the layout.
            return Lineage(earlier, shared, {}, clean, None, base_scanned, shared_bytes)
        layout = replaces.layout if replaces is not None else layout_of(raw, elements, name)
        if layout is None:
            return None
        if len(layout.ends) != len(elements):
            return Lineage(earlier, shared, {}, clean, None, base_scanned, shared_bytes)
        rest = replaces.body if replaces is not None else None
        entry = _Remembered(raw, layout, elements, digests, translation, rest)
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
            if hint is not None:
                self._by_hint[(name, hint)] = key
                self._by_hint.move_to_end((name, hint))
                if len(self._by_hint) > _MAX_HINTS:
                    self._by_hint.popitem(last=False)
        return Lineage(
            earlier, shared, entry.chains, clean, entry.scanned, base_scanned, shared_bytes
        )


# A body's other members (to take its array), its new elements, where they end, its ``]``.
_Rest = tuple[dict[str, Any], list[Any], list[int], int]


def _rest_by_suffix(raw: bytes, base: _Remembered, start: int) -> _Rest | None:
    """The elements after ``start`` parsed in one call, and the base's other members as they
    were: when ``raw`` ends with the base's bytes from its array's ``]`` on, and the base's
    other members are known. The bytes before the array are shared too (the two share a
    message), so every member but the array is the base's."""
    closed = base.layout.closed
    if base.rest is None or closed is None:
        return None
    suffix = memoryview(base.raw)[closed:]
    close = len(raw) - len(suffix)
    if close < start or not raw.endswith(suffix):
        return None
    between = elements_between(raw, start, close)
    if between is None:
        return None
    new, ends = between
    return dict(base.rest), new, ends, close


def _clean_bytes(raw: bytes, extension: Extension | None) -> int:
    """How many of ``raw``'s first bytes are known to hold no run of digits: those it shares
    with the remembered body it extends, if a scan found that one clean."""
    if extension is None or not extension.base.scanned.clean:
        return 0
    return _shared_bytes(raw, extension)


def _shared_bytes(raw: bytes, extension: Extension | None) -> int:
    """How many of ``raw``'s first bytes are the remembered body's it extends, up to the end
    of their last shared message (its closing brace)."""
    if extension is None or extension.known == 0:
        return 0
    shared = extension.base.layout.ends[extension.known - 1]
    return shared if raw[shared - 1 : shared] == b"}" else 0


def _shared_messages(raw: bytes, base: _Remembered) -> int:
    """How many of ``base``'s messages ``raw`` repeats byte for byte, from its first byte.

    A body usually differs, if at all, in its last message (Claude Code moves its cache
    breakpoint from the turn it sent last to the newest one), and each look at a prefix
    compares as many bytes as the body holds. So the prefix up to the message before last is
    compared once, then the last message alone: one long compare whether or not the last
    message differs. Elsewhere, galloping back from the end before bisecting: a plain
    bisection compared about log2(messages) long prefixes every request."""
    ends = base.layout.ends
    view = memoryview(base.raw)
    if len(ends) == 1:
        return 1 if raw.startswith(view[: ends[0]]) else 0
    if raw.startswith(view[: ends[-2]]):
        last = view[ends[-2] : ends[-1]]
        return len(ends) if raw.startswith(last, ends[-2]) else len(ends) - 1
    low, high = 0, len(ends) - 2  # invariant: the first `low` messages are shared
    step = 1
    while step <= high:
        if raw.startswith(view[: ends[high - step]]):
            low = high - step + 1
            break
        high -= step
        step *= 2
    while low < high:
        middle = (low + high + 1) // 2
        if raw.startswith(view[: ends[middle - 1]]):
            low = middle
        else:
            high = middle - 1
    return low
