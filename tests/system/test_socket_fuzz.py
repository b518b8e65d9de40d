"""Property-based, a Responses WebSocket: whatever frames a client sends, and whatever the
upstream answers them with, each frame gets one answer that ends (a completed response or an
``error`` event, never a 5xx of the proxy's own), the socket stays open, and a good frame is
served after them.

Frames: ``response.create`` bodies valid-looking and junk at every level (previous response ids
naming the connection's last response, another, or junk; prewarms), JSON that is no object,
other event types, text that is no JSON, binary frames. Answers: what an upstream may answer
(``tests.scripted_upstream``); a stream's events reach the client a frame each, as sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.scripted_upstream import Answer, ScriptedUpstream, answers, history, normal_answer
from tests.strategies import items, junk, texts, words
from tests.threaded_proxy import MODEL, WINDOW, serving

pytest.importorskip("hypothesis")
pytest.importorskip("websockets")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

EXAMPLES = 300
LAST = "<the connection's last response>"
ENDS = ("response.completed", "response.incomplete", "response.failed", "error")

creates = st.fixed_dictionaries(
    {"type": st.just("response.create"), "model": st.just(MODEL) | junk},
    optional={
        "input": st.lists(items, max_size=6) | words | junk,
        "instructions": words | junk,
        "tools": junk,
        "previous_response_id": st.just(LAST) | texts(8) | junk,
        "generate": st.just(False) | junk,
        "store": st.booleans() | junk,
        "max_output_tokens": st.integers(min_value=-5, max_value=10**30) | junk,
    },
)
frames = st.lists(
    creates.map(lambda frame: ("text", frame))
    | junk.map(lambda value: ("text", value))
    | st.fixed_dictionaries({"type": texts(12) | junk}).map(lambda frame: ("text", frame))
    | texts(20).map(lambda text: ("raw", text))
    | st.binary(max_size=40).map(lambda data: ("binary", data)),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def proxy_port() -> Iterator[int]:
    fake = FakeUpstream()
    fake.windows[MODEL] = WINDOW
    with serving(fake.app()) as port:
        yield port


def answer_of(socket: ClientConnection) -> list[dict[str, Any]]:
    """The events answering one frame, up to the one that ends it."""
    events = []
    while True:
        events.append(orjson.loads(socket.recv(timeout=60)))
        if events[-1].get("type") in ENDS:
            return events


def sent(kind: str, value: Any, last: str | None) -> str | bytes:
    if kind == "binary":
        assert isinstance(value, bytes)
        return value
    if kind == "raw":
        return str(value)
    if isinstance(value, dict) and value.get("previous_response_id") == LAST:
        value = {**value, "previous_response_id": last or "resp_none"}
    return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_SUBCLASS).decode()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(frames=frames)
def test_every_frame_gets_one_answer_that_ends_and_the_socket_goes_on(
    proxy_port: int, frames: list[tuple[str, Any]]
) -> None:
    url = f"ws://127.0.0.1:{proxy_port}/v1/responses"
    with connect(url, additional_headers={"Authorization": "Bearer k"}, max_size=None) as socket:
        last = None
        for kind, value in frames:
            try:
                frame = sent(kind, value, last)
            except orjson.JSONEncodeError:
                continue  # not JSON a client could send
            socket.send(frame)
            events = answer_of(socket)
            end = events[-1]
            if end["type"] == "error":
                status = end["status"]
                assert 400 <= status < 500 or end["headers"].get("x-request-id", "").startswith(
                    "req_fake"
                ), end
                assert isinstance(end["error"]["message"], str) and end["error"]["message"]
            elif end["type"] == "response.completed":
                last = end["response"]["id"]
        good = {"type": "response.create", "model": MODEL, "input": "Hi."}
        socket.send(orjson.dumps(good).decode())
        assert answer_of(socket)[-1]["type"] == "response.completed"


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[int, ScriptedUpstream]]:
    upstream = ScriptedUpstream()
    with serving(upstream.app()) as port:
        yield port, upstream


def events_data(stream: bytes) -> list[bytes]:
    """Each event's data, for events with one ``data:`` line, up to the first that ends the
    answer (read here apart from the proxy's own reader: line ends made LF, events cut at
    blank lines)."""
    text = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    found = []
    for event in text.split(b"\n\n"):
        data = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if len(data) == 1:
            found.append(data[0])
            if ends_an_answer(data[0]):
                break
    return found


def ends_an_answer(data: bytes) -> bool:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and isinstance(event.get("type"), str) and event["type"] in ENDS


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(answer=answers())
def test_any_upstream_answer_reaches_a_socket_client_as_events_and_the_socket_goes_on(
    scripted: tuple[int, ScriptedUpstream], answer: Answer
) -> None:
    port, upstream = scripted
    url = f"ws://127.0.0.1:{port}/v1/responses"
    create = {"type": "response.create", "model": MODEL, "input": history("responses", "Fix it.")}
    with connect(url, additional_headers={"Authorization": "Bearer k"}, max_size=None) as socket:
        upstream.answer = answer
        socket.send(orjson.dumps(create).decode())
        frames = []
        while True:
            frames.append(socket.recv(timeout=60))
            try:
                event = orjson.loads(frames[-1])
            except orjson.JSONDecodeError:
                continue  # an event's data as the upstream wrote it
            if isinstance(event, dict) and event.get("type") in ENDS:
                break
        end = orjson.loads(frames[-1])
        streamed = (answer.content_type or "").startswith("text/event-stream")
        if answer.status < 300 and streamed:
            sent = [frame.encode() for frame in frames]
            # Text frames hold UTF-8: what is not arrives replaced.
            expected = [data.decode(errors="replace").encode() for data in events_data(answer.body)]
            if len(sent) == len(expected) + 1:  # none of them ended it: the proxy says so
                assert end["type"] == "error" and end["status"] == 502, end
                sent.pop()
            assert sent == expected, (sent, expected)
        elif answer.status >= 400:
            assert end["type"] == "error" and 400 <= end["status"] < 600, end
            assert end["status"] == answer.status or end["status"] < 500, end
        upstream.answer = normal_answer("responses")
        socket.send(orjson.dumps({**create, "input": "And now?"}).decode())
        assert answer_of(socket)[-1]["type"] == "response.completed"
