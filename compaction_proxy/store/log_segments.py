"""A conversation's Redis log, packed into zstd segments (pure).

Events are logged to the stream as plain JSON, and the stream's oldest entries are then packed,
a run at a time, into zstd frames: a **segment**, kept in a String key of its own, named in
a List of ``Segment`` index lines. The frames are written by a plain ``SET`` beside the script
that lands the pack, so it never passes through Lua. An agent's log is mostly tool outputs
and file reads that repeat each other; compressed together they shrink about four times as
much as event by event, and one call to zstd for a run costs far less than one call per event
(figures in ``docs/perf.md``).

The stream holds the newest events, unpacked; the segments hold the older ones, in order. A
pack takes a prefix of the stream, never a middle: ``pack.lua`` lands a pack only when its run
starts at the stream's oldest entry and holds every entry up to its last, so segments never
overlap and never skip an event, however replicas race.

No pack reads the log back on its usual path. Every entry the scripts add gets the next
**ordinal** of its conversation (the state counts them), and the state names the ordinal of
the stream's oldest entry. The process that logs events remembers them with their ordinals
(``LoggedBatch``), so it knows which of them run unbroken from the stream's oldest entry
(``linked_run``), and ``pack.lua`` checks a run by ordinals and counts alone: no event passes
through Lua, where each kilobyte copied costs about as much as a command. Only a stream whose
unpacked bytes reach ``READ_PACK_AT_BYTES`` with no process holding a run (another replica
logged part of it, or this one restarted) is read back to be packed.

A segment grows by merging the next run into it while both fit ``SegmentLimits``: bigger
segments compress better, and the limits keep one segment a small part of the log's bounds,
so dropping the oldest segment whole never drops much more than the bounds ask. A merge
appends one zstd frame holding the new run alone, compressed with the segment's lines so far
as its prefix: it refers back into them as one frame of the whole would, yet each run is
compressed once, not once for every run merged after it. A segment is thus one frame or
several in a row, each read with the lines of those before it as its prefix (``decompress``);
a segment of one frame is what plain ``zstd.compress`` makes.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat
from operator import add, itemgetter

from compaction_proxy.frozen import frozen

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

PACK_AT_BYTES = 32 * 1024  # a run of unpacked events this large is packed (four a segment)
READ_PACK_AT_BYTES = 2 * PACK_AT_BYTES  # past this, a stream no process holds is read back
SEGMENT_BYTES = 128 * 1024  # a segment grows by merging while its lines fit this
LEVEL = 3  # zstd's default: hundreds of MB/s on one core, and most of the ratio
PREFIX_BYTES = 8  # zstd takes no shorter prefix: a frame after fewer lines stands alone

Entry = tuple[str, bytes]  # a stream entry's id and its event's JSON


def lines_size(entries: Iterable[Entry]) -> int:
    """The bytes of the entries' JSON lines (summed in C: it runs on every logged batch)."""
    return sum(map(len, map(itemgetter(1), entries)))


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream id (``<ms>-<seq>``) as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@frozen
class LoggedBatch:
    """Entries one script call added to the stream, in order; the first has ordinal
    ``first``, each next one the ordinal after."""

    first: int
    entries: tuple[Entry, ...]

    @property
    def end(self) -> int:
        """The ordinal after its last entry."""
        return self.first + len(self.entries)


def linked_run(batches: Iterable[LoggedBatch], oldest: int) -> list[Entry]:
    """The entries of ``batches`` that run unbroken from ordinal ``oldest`` (the stream's
    oldest entry): the batch holding it first, then each batch that starts where the run
    ends. Empty when no batch holds ``oldest``: an entry this process did not log comes first."""
    run: list[Entry] = []
    end = oldest
    for batch in sorted(batches, key=lambda b: b.first):
        if batch.end <= end:
            continue
        if batch.first > end:
            break
        run.extend(batch.entries[end - batch.first :])
        end = batch.end
    return run


def batches_from(batches: Iterable[LoggedBatch], oldest: int) -> list[LoggedBatch]:
    """``batches`` without their entries older than ordinal ``oldest`` (packed, or dropped
    for the log's bounds)."""
    kept: list[LoggedBatch] = []
    for batch in batches:
        if batch.end <= oldest:
            continue
        if batch.first < oldest:
            batch = LoggedBatch(oldest, batch.entries[oldest - batch.first :])
        kept.append(batch)
    return kept


@frozen
class SegmentLimits:
    """How much one segment may hold: bytes of lines, and events."""

    lines: int
    events: int

    @classmethod
    def for_bounds(cls, max_log_bytes: int, max_log_events: int) -> SegmentLimits:
        """At most an eighth of either bound, so that dropping the oldest segment whole keeps
        the log near its bounds."""
        return cls(max(1, min(SEGMENT_BYTES, max_log_bytes // 8)), max(1, max_log_events // 8))


def due(size: int, count: int, limits: SegmentLimits) -> bool:
    """Whether ``count`` entries of ``size`` bytes make a pack due."""
    return count >= limits.events or size >= min(PACK_AT_BYTES, limits.lines)


def pack_due(run: Sequence[Entry], limits: SegmentLimits) -> bool:
    return due(lines_size(run), len(run), limits)


def pack_chunk(run: Sequence[Entry], limits: SegmentLimits) -> list[Entry]:
    """The prefix of ``run`` one segment takes: at least its first entry, and no more than
    the limits allow (its lines' bytes, ``<id>\\t<JSON>\\n`` each, summed in C: a pack
    looks over every entry held)."""
    head = run[: max(1, limits.events)]
    sizes = map(add, map(len, map(itemgetter(1), head)), map(len, map(itemgetter(0), head)))
    ends = list(accumulate(map(add, sizes, repeat(2))))
    return list(head[: max(1, bisect_right(ends, limits.lines))])


@frozen
class Segment:
    """One packed segment as the index lists it: its first and last entry ids, how many
    events it holds, the bytes its frame takes, the bytes of its lines, and the token naming
    the key its frame is kept under."""

    first: str
    last: str
    events: int
    stored: int
    lines: int
    token: str

    def index_line(self) -> str:
        """As the Lua scripts read it: events 3rd, stored bytes 4th, the token last."""
        return f"{self.first} {self.last} {self.events} {self.stored} {self.lines} {self.token}"


def segment_lines(entries: Iterable[Entry]) -> bytes:
    """Entries as a segment's lines: ``<id>\\t<event JSON>\\n`` (JSON holds no raw newline)."""
    return b"".join(b"%s\t%s\n" % (entry_id.encode(), line) for entry_id, line in entries)


def compress(lines: bytes, prefix: bytes = b"") -> bytes:
    """One zstd frame of ``lines``; with ``prefix``, one that refers back into it, read only
    with the same prefix (``decompress``)."""
    if len(prefix) < PREFIX_BYTES:
        return zstd.compress(lines, LEVEL)
    return zstd.compress(lines, LEVEL, zstd_dict=zstd.ZstdDict(prefix, is_raw=True).as_prefix)


class DamagedSegment(ValueError):
    """A segment's frames do not read: damaged, cut short, or encoded by a later version."""


def decompress(frames: bytes) -> bytes:
    """A segment's lines: its frames in turn, each read with the lines before it as its prefix.
    Raises ``DamagedSegment`` for frames that do not read whole."""
    lines = b""
    rest = frames
    try:
        while rest:
            prefix = None
            if len(lines) >= PREFIX_BYTES:
                prefix = zstd.ZstdDict(lines, is_raw=True).as_prefix
            reader = zstd.ZstdDecompressor(prefix)
            lines += reader.decompress(rest)
            if not reader.eof:
                raise DamagedSegment("a segment's frame is cut short")
            rest = reader.unused_data
    except zstd.ZstdError as exc:
        raise DamagedSegment(str(exc)) from exc
    return lines


def entries_of(lines: bytes) -> list[Entry]:
    """A segment's lines back as entries."""
    entries: list[Entry] = []
    for line in lines.split(b"\n"):
        if line:
            entry_id, _, event = line.partition(b"\t")
            entries.append((entry_id.decode(), event))
    return entries


@frozen
class PackPlan:
    """A pack ready to send: the run it takes off the stream, and the segment it lands as
    (``merged`` with the newest segment, which it then replaces, or appended). ``frame``: the
    segment's frames, as stored."""

    chunk: tuple[Entry, ...]
    segment: Segment
    frame: bytes
    merged: Segment | None


def plan_pack(
    chunk: Sequence[Entry],
    limits: SegmentLimits,
    token: str,
    newest: Segment | None = None,
    newest_frames: bytes = b"",
) -> PackPlan:
    """Compress ``chunk`` into a segment kept under ``token``, merged into the ``newest``
    segment (whose frames the caller holds) when both fit one segment's limits: its frames,
    then one of ``chunk``'s lines alone with the newest segment's lines as its prefix."""
    lines = segment_lines(chunk)
    first, last = chunk[0][0], chunk[-1][0]
    fits = (
        newest is not None
        and newest.lines + len(lines) <= limits.lines
        and newest.events + len(chunk) <= limits.events
    )
    newest_lines = decompress(newest_frames) if fits else b""
    if newest is not None and fits and len(newest_lines) == newest.lines:
        frame = newest_frames + compress(lines, newest_lines)
        events = newest.events + len(chunk)
        size = newest.lines + len(lines)
        segment = Segment(newest.first, last, events, len(frame), size, token)
        return PackPlan(tuple(chunk), segment, frame, newest)
    frame = compress(lines)
    segment = Segment(first, last, len(chunk), len(frame), len(lines), token)
    return PackPlan(tuple(chunk), segment, frame, None)


def page_after(
    packed: Iterable[Entry], stream: Iterable[Entry], after: str | None, limit: int
) -> tuple[list[Entry], bool]:
    """Up to ``limit`` entries after ``after``: those of the segments read, then the stream's
    (every segment is older than the stream); and whether more follow."""
    start = id_order(after) if after else None
    page: list[Entry] = []
    for entry in (*packed, *stream):
        if start is not None and id_order(entry[0]) <= start:
            continue
        if len(page) == limit:
            return page, True
        page.append(entry)
    return page, False
