"""Edits to an upstream's answer (pure): untouched events pass byte for byte, however the
stream is cut into chunks; the compaction item goes first, the upstream's output after it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.formats.answer_edits import EventEditor, EventStream, event_fields, sse_event
from compaction_proxy.formats.responses_compaction import FirstOutputItem

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

ITEM = {"id": "cmp_1", "type": "compaction", "encrypted_content": "cpx1.x.y"}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}


def upstream_stream() -> bytes:
    response = {"id": "resp_1", "object": "response", "output": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response, "sequence_number": 0},
        {"type": "response.output_item.added", "output_index": 0, "item": MESSAGE},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "hi"},
        {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE},
        {"type": "response.completed", "response": {**response, "output": [MESSAGE]}},
    ]
    return b": keep-alive\n\n" + b"".join(sse_event(e) for e in events)


def edited(chunks: list[bytes]) -> bytes:
    editor = FirstOutputItem(ITEM).editor()
    return b"".join(editor.feed(chunk) for chunk in chunks) + editor.close()


def data_of(stream: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in stream.splitlines() if line.startswith(b"data: ")]


def test_the_item_goes_first_and_the_upstreams_output_moves_up_by_one() -> None:
    events = data_of(edited([upstream_stream()]))
    added = [(e["output_index"], e["item"]["type"]) for e in events if e["type"].endswith("added")]
    assert added == [(0, "compaction"), (1, "message")]
    assert events[-1]["response"]["output"] == [ITEM, MESSAGE]
    assert [e["output_index"] for e in events if e["type"] == "response.output_text.delta"] == [1]


@given(st.lists(st.integers(1, 400), max_size=20))
def test_however_the_stream_is_cut_the_edit_is_the_same(cuts: list[int]) -> None:
    stream = upstream_stream()
    chunks, start = [], 0
    for size in cuts:
        chunks.append(stream[start : start + size])
        start += size
    chunks.append(stream[start:])
    assert edited(chunks) == edited([stream])


def test_events_left_alone_pass_byte_for_byte() -> None:
    stream = b'event: x\r\ndata: {"type":"x","a" : 1}\r\n\r\n: comment\n\ndata: [DONE]\n\n'
    editor = EventEditor(lambda event: None)
    assert editor.feed(stream[:7]) + editor.feed(stream[7:]) + editor.close() == stream


def test_a_whole_answer_lists_the_item_first() -> None:
    body = orjson.dumps({"id": "resp_1", "output": [MESSAGE]})
    assert orjson.loads(FirstOutputItem(ITEM).whole(body))["output"] == [ITEM, MESSAGE]
    assert FirstOutputItem(ITEM).whole(b"not json") == b"not json"


# Line ends as the SSE standard allows them, and events written with them: (name, data, end).
LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
NAMES = st.sampled_from([b"response.created", b"response.completed", b"x"])
DATA = st.binary(min_size=1, max_size=30).map(
    lambda raw: bytes(b for b in raw if b not in b" \t\n\r\x0b\x0c") or b"{}"
)


def written(name: bytes, data: bytes, end: bytes) -> bytes:
    return b"event: " + name + end + b"data: " + data + end + end


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    chunks, start = [], 0
    for size in cuts:
        chunks.append(stream[start : start + size])
        start += size
    return [*chunks, stream[start:]]


@given(
    st.lists(st.tuples(NAMES, DATA, LINE_ENDS), max_size=6),
    st.lists(st.integers(1, 40), max_size=12),
)
def test_a_streams_events_are_cut_at_each_blank_line_however_it_arrives(
    events: list[tuple[bytes, bytes, bytes]], cuts: list[int]
) -> None:
    """CRLF, LF or CR alone: each event comes out whole, with its name and data, every byte
    in order, whatever the chunks (a CR at a chunk's end may be half of a CRLF)."""
    sent = [written(*event) for event in events]
    stream = EventStream()
    out = [event for chunk in split(b"".join(sent), cuts) for event in stream.feed(chunk)]
    rest = stream.close()  # the last event when a CR ends it: the stream's end completes it
    out += [rest] if rest else []
    assert out == sent
    assert [event_fields(event) for event in out] == [(name, data) for name, data, _ in events]
