"""The packed log's pure core: which logged entries run from the stream's head, how a run is
cut and merged into segments, and how a page is read across segments and the stream."""

from __future__ import annotations

import sys

import orjson
import pytest

from compaction_proxy.store.log_segments import (
    PACK_AT_BYTES,
    DamagedSegment,
    LoggedBatch,
    Segment,
    SegmentLimits,
    batches_from,
    compress,
    decompress,
    entries_of,
    id_order,
    linked_run,
    pack_chunk,
    pack_due,
    page_after,
    plan_pack,
    segment_lines,
)

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

WIDE = SegmentLimits(lines=1 << 20, events=1000)


def entry(n: int, size: int = 10) -> tuple[str, bytes]:
    return f"100-{n}", b"x" * size


def batch(*numbers: int) -> LoggedBatch:
    """Entries whose ids and ordinals are ``numbers`` (consecutive)."""
    return LoggedBatch(numbers[0], tuple(entry(n) for n in numbers))


def ids(entries: list[tuple[str, bytes]]) -> list[str]:
    return [entry_id for entry_id, _ in entries]


def test_stream_ids_order_by_time_then_sequence() -> None:
    assert sorted(["2-0", "10-0", "2-11", "2-2"], key=id_order) == ["2-0", "2-2", "2-11", "10-0"]


@pytest.mark.parametrize(
    ("batches", "oldest", "run"),
    [
        # batches that follow each other, from the stream's head
        ([batch(1, 2), batch(3)], 1, [1, 2, 3]),
        # received out of order: linked by their ordinals, not by arrival
        ([batch(3), batch(1, 2)], 1, [1, 2, 3]),
        # another replica's entry 3 comes between: the run stops before the gap
        ([batch(1, 2), batch(4)], 1, [1, 2]),
        # the head is another's entry: no run at all
        ([batch(2, 3)], 1, []),
        # the head was packed or dropped part way through a batch
        ([batch(1, 2, 3), batch(4)], 2, [2, 3, 4]),
        # everything held is older than the head
        ([batch(1)], 2, []),
    ],
)
def test_a_run_is_what_this_process_logged_unbroken_from_the_head(
    batches: list[LoggedBatch], oldest: int, run: list[int]
) -> None:
    assert ids(linked_run(batches, oldest)) == [f"100-{n}" for n in run]


def test_batches_lose_only_the_entries_older_than_the_head() -> None:
    kept = batches_from([batch(1, 2), batch(3, 4), batch(5)], 4)
    assert [(b.first, ids(list(b.entries))) for b in kept] == [(4, ["100-4"]), (5, ["100-5"])]
    assert batches_from([batch(1)], 2) == []


def test_a_pack_is_due_at_its_bytes_or_at_a_segments_events() -> None:
    assert not pack_due([entry(1, PACK_AT_BYTES - 1)], WIDE)
    assert pack_due([entry(1, PACK_AT_BYTES)], WIDE)
    assert pack_due([entry(n) for n in range(3)], SegmentLimits(lines=1 << 20, events=3))
    # a small byte bound packs sooner: a segment is at most an eighth of it
    assert pack_due([entry(1, 200)], SegmentLimits.for_bounds(1600, 10_000))


def test_a_chunk_keeps_within_a_segments_limits_and_takes_at_least_one_entry() -> None:
    run = [entry(n, 100) for n in range(10)]
    assert len(pack_chunk(run, SegmentLimits(lines=400, events=100))) == 3  # 107 bytes a line
    assert len(pack_chunk(run, SegmentLimits(lines=1 << 20, events=4))) == 4
    assert len(pack_chunk(run, SegmentLimits(lines=10, events=100))) == 1


def _chunk_entry_by_entry(run: list[tuple[str, bytes]], limits: SegmentLimits) -> list[str]:
    chunk: list[str] = []
    size = 0
    for entry_id, line in run:
        size += len(line) + len(entry_id) + 2
        if chunk and (size > limits.lines or len(chunk) >= limits.events):
            break
        chunk.append(entry_id)
    return chunk


@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=2000),
    st.integers(min_value=1, max_value=50),
)
def test_a_chunk_is_the_prefix_an_entry_by_entry_count_takes(
    sizes: list[int], lines: int, events: int
) -> None:
    run = [entry(n, size) for n, size in enumerate(sizes)]
    limits = SegmentLimits(lines=lines, events=events)
    assert ids(pack_chunk(run, limits)) == _chunk_entry_by_entry(run, limits)


def test_segment_limits_are_an_eighth_of_the_logs_bounds() -> None:
    assert SegmentLimits.for_bounds(16 * 1024 * 1024, 10_000) == SegmentLimits(128 * 1024, 1250)
    assert SegmentLimits.for_bounds(80_000, 8) == SegmentLimits(10_000, 1)


def test_a_segment_index_line_has_the_fields_the_scripts_read_in_their_places() -> None:
    segment = Segment("1-0", "9-3", 12, 400, 5000, "a1b2")
    assert segment.index_line() == "1-0 9-3 12 400 5000 a1b2"


def test_a_chunk_merges_into_the_newest_segment_only_while_both_fit() -> None:
    first = plan_pack([entry(1, 100), entry(2, 100)], WIDE, "t1")
    assert first.merged is None and first.segment.events == 2
    lines = decompress(first.frame)
    merged = plan_pack([entry(3, 100)], WIDE, "t2", first.segment, first.frame)
    assert merged.merged == first.segment and merged.segment.token == "t2"
    assert (merged.segment.first, merged.segment.last, merged.segment.events) == (
        "100-1",
        "100-3",
        3,
    )
    assert ids(entries_of(decompress(merged.frame))) == ["100-1", "100-2", "100-3"]
    assert merged.segment.lines == len(decompress(merged.frame))
    tight = SegmentLimits(lines=len(lines) + 50, events=1000)
    alone = plan_pack([entry(3, 100)], tight, "t3", first.segment, first.frame)
    assert alone.merged is None and alone.segment.first == "100-3"
    # frames that are not the newest segment's (another's, or lost) are never merged into
    other = compress(lines[:-1])
    assert plan_pack([entry(3, 100)], WIDE, "t4", first.segment, other).merged is None


def test_a_merge_compresses_the_new_run_alone_and_keeps_the_frames_before_it() -> None:
    """Each run is compressed once: merging appends a frame of the new lines, which refers
    back into the segment's lines (so it is smaller than the same lines compressed alone)."""
    run = [(f"100-{n}", b'{"output": "importer log line %d"}' % (n % 7)) for n in range(200)]
    first = plan_pack(run[:100], WIDE, "t1")
    merged = plan_pack(run[100:], WIDE, "t2", first.segment, first.frame)
    assert merged.frame.startswith(first.frame)
    appended = merged.frame[len(first.frame) :]
    assert len(appended) < len(compress(segment_lines(run[100:])))
    assert entries_of(decompress(merged.frame)) == run
    assert merged.segment.stored == len(merged.frame)


def test_a_segment_of_one_frame_of_all_its_lines_reads_as_before() -> None:
    """Earlier versions compressed a merged segment's lines again as one frame."""
    run = [entry(n, 50) for n in range(1, 9)]
    assert entries_of(decompress(zstd.compress(segment_lines(run), 3))) == run


def test_a_segment_cut_short_is_refused_not_read_in_part() -> None:
    first = plan_pack([entry(1, 100), entry(2, 100)], WIDE, "t1")
    merged = plan_pack([entry(3, 100)], WIDE, "t2", first.segment, first.frame)
    with pytest.raises(DamagedSegment):
        decompress(merged.frame[:-3])
    with pytest.raises(DamagedSegment):
        decompress(b"not a frame at all")


def test_a_page_reads_segments_then_the_stream_after_its_cursor() -> None:
    packed = [entry(n) for n in range(1, 5)]
    stream = [entry(n) for n in range(5, 8)]
    page, more = page_after(packed, stream, None, 3)
    assert (ids(page), more) == (["100-1", "100-2", "100-3"], True)
    page, more = page_after(packed, stream, "100-3", 3)
    assert (ids(page), more) == (["100-4", "100-5", "100-6"], True)
    page, more = page_after(packed, stream, "100-6", 3)
    assert (ids(page), more) == (["100-7"], False)


JSON_TEXT = st.text(st.characters(codec="utf-8"), max_size=200)


@given(st.lists(st.dictionaries(st.text(max_size=5), JSON_TEXT, max_size=4), max_size=30))
def test_a_segment_holds_its_events_in_order_byte_for_byte(events: list[dict[str, str]]) -> None:
    entries = [(f"{n + 1}-{n % 3}", orjson.dumps(event)) for n, event in enumerate(events)]
    assert entries_of(decompress(compress(segment_lines(entries)))) == entries


@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=12),
    st.integers(1, 40),
    st.sets(st.integers(0, 12)),
    st.permutations(range(12)),
)
def test_a_run_never_skips_an_entry(
    sizes: list[int], head: int, foreign: set[int], order: list[int]
) -> None:
    """Whatever batches a process holds, in whatever order they arrived, with other
    replicas' entries between them, the run it would pack is consecutive entries of the stream
    starting at its head."""
    batches: list[LoggedBatch] = []
    stream: list[int] = []
    for index, size in enumerate(sizes):
        if index in foreign:  # another replica logs one entry here
            stream.append(len(stream) + 1)
        numbers = list(range(len(stream) + 1, len(stream) + size + 1))
        batches.append(batch(*numbers))
        stream += numbers
    arrived = [batches[i] for i in order if i < len(batches)]
    oldest = min(head, len(stream))
    run = [int(entry_id.split("-")[1]) for entry_id in ids(linked_run(arrived, oldest))]
    assert run == stream[oldest - 1 : oldest - 1 + len(run)]
    assert run == [] or run[0] == oldest


@given(st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=8), max_size=6))
def test_runs_merged_one_by_one_read_back_in_order_byte_for_byte(runs: list[list[bytes]]) -> None:
    entries: list[tuple[str, bytes]] = []
    newest = None
    for run in runs:
        chunk = [
            (f"{len(entries) + n + 1}-0", b"e" + value.replace(b"\n", b" "))
            for n, value in enumerate(run)
        ]
        plan = plan_pack(chunk, WIDE, "t", *(newest or ()))
        entries += chunk
        newest = (plan.segment, plan.frame)
    assert newest is None or entries_of(decompress(newest[1])) == entries
