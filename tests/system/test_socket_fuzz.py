"""Property-based: whatever frames a client sends on a Responses WebSocket, each gets one
answer that ends (a completed response or an ``error`` event, never a 5xx of the proxy's own),
the socket stays open, and a good frame is served after them.

Frames: ``response.create`` bodies valid-looking and junk at every level (previous response ids
naming the connection's last response, another, or junk; prewarms), JSON that is no object,
other event types, text that is no JSON, binary frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
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


def answer(socket: ClientConnection) -> list[dict[str, Any]]:
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
            events = answer(socket)
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
        assert answer(socket)[-1]["type"] == "response.completed"
