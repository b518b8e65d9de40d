"""Responses frames as HTTP requests (pure): a frame continuing the connection's last response
carries its whole history, a prewarm is answered here, refusals read as the provider's error
events; and the headers each frame's request carries."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.formats.responses_socket import RESPONSES_SOCKET as SOCKET
from compaction_proxy.formats.responses_socket import http_body
from compaction_proxy.formats.wire import FrameRefused, SocketRequest, SocketResponse
from compaction_proxy.http.socket_endpoint import loopback_headers
from compaction_proxy.parsing import jsonio
from tests.strategies import items, junk, texts

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

TASK = {"role": "user", "content": "Fix the test."}
CALL = {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
LAST = SocketResponse("resp_1", [TASK], [CALL])


@pytest.mark.parametrize(
    ("body", "last", "expected"),
    [
        # Nothing to continue: the frame as sent, streamed.
        ({"input": [TASK]}, None, {"input": [TASK], "stream": True}),
        # Continuing the last response: its input and output first, the id gone.
        (
            {"previous_response_id": "resp_1", "input": [OUTPUT]},
            LAST,
            {"input": [TASK, CALL, OUTPUT], "stream": True},
        ),
        # Text input continues as a user message.
        (
            {"previous_response_id": "resp_1", "input": "go on"},
            LAST,
            {"input": [TASK, CALL, {"role": "user", "content": "go on"}], "stream": True},
        ),
        # An id the connection did not answer goes on as sent: the provider's to find.
        (
            {"previous_response_id": "resp_0", "input": [OUTPUT]},
            LAST,
            {"previous_response_id": "resp_0", "input": [OUTPUT], "stream": True},
        ),
        # An input that is neither text nor items: the endpoint's to refuse, untouched.
        (
            {"previous_response_id": "resp_1", "input": 7},
            LAST,
            {"previous_response_id": "resp_1", "input": 7, "stream": True},
        ),
        # No input at all continues with nothing new.
        ({"previous_response_id": "resp_1"}, LAST, {"input": [TASK, CALL], "stream": True}),
    ],
)
def test_a_frame_continuing_the_last_response_is_its_whole_history(
    body: dict[str, Any], last: SocketResponse | None, expected: dict[str, Any]
) -> None:
    assert http_body(body, last) == expected
    request = SOCKET.http_request(body, last)
    assert request.body == expected and jsonio.loads(request.raw) == expected


@pytest.mark.parametrize(
    "frame", [[1], "text", {"type": "response.steer"}, {"model": "m"}, {"type": None}]
)
def test_a_frame_that_is_not_a_create_is_refused(frame: Any) -> None:
    with pytest.raises(FrameRefused):
        SOCKET.request_body(frame)


def test_a_create_frame_is_its_fields_less_its_type() -> None:
    frame = {"type": "response.create", "model": "m", "input": "hi"}
    assert SOCKET.request_body(frame) == {"model": "m", "input": "hi"}


def test_a_prewarm_is_answered_here_and_continued_from() -> None:
    sent = SOCKET.http_request({"model": "m", "input": [TASK], "generate": False}, None)
    events = SOCKET.answered_here(sent.body)
    assert events is not None
    assert [e["type"] for e in events] == ["response.created", "response.completed"]
    assert events[0]["response"]["id"] == events[1]["response"]["id"]
    assert SOCKET.continued_by(events[0], sent) is None
    continued = SOCKET.continued_by(events[1], sent)
    assert continued == SocketResponse(events[1]["response"]["id"], [TASK], [])
    for asks in ({}, {"generate": True}):
        assert SOCKET.answered_here({"model": "m", **asks}) is None


@pytest.mark.parametrize(
    ("event", "continued"),
    [
        ({"type": "response.completed", "response": {"id": "r", "output": [CALL]}}, True),
        ({"type": "response.incomplete", "response": {"id": "r", "output": []}}, True),
        ({"type": "response.failed", "response": {"id": "r", "output": []}}, False),
        ({"type": "response.output_item.done", "item": CALL}, False),
        ({"type": "response.completed", "response": {"id": 3, "output": []}}, False),
        ({"type": "response.completed", "response": {"id": "r", "output": None}}, False),
        ({"type": "response.completed", "response": "r"}, False),
        ({"type": {"response.completed": 1}, "response": {"id": "r", "output": []}}, False),
        ({"type": ["x"]}, False),
    ],
)
def test_only_a_response_that_ended_well_is_continued_from(
    event: dict[str, Any], continued: bool
) -> None:
    found = SOCKET.continued_by(event, SocketRequest({"input": [TASK]}, b""))
    assert (found is not None) is continued
    if found is not None:
        assert found.input == [TASK] and found.output == event["response"]["output"]


@pytest.mark.parametrize(
    ("kind", "ends"),
    [
        ("response.completed", True),
        ("response.incomplete", True),
        ("response.failed", True),
        ("error", True),
        ("response.output_text.delta", False),
        (None, False),
        ({"error": 1}, False),  # an upstream may write anything there
        (["error"], False),
    ],
)
def test_an_answer_ends_with_a_response_that_ended_or_an_error(kind: Any, ends: bool) -> None:
    assert SOCKET.ends({"type": kind}) is ends
    data = orjson.dumps({"sequence_number": 1, "type": kind})
    assert SOCKET.may_end(data) or not ends  # never passed over unread


@pytest.mark.parametrize(
    ("data", "read"),
    [
        (b'{"type":"response.output_text.delta","delta":"hi"}', False),
        (b'{"type":"response.completed","response":{}}', True),
        (b'{"type": "error", "error": {}}', True),
        (b'{"type":"\\u0065rror"}', True),  # "error", escaped: read, to be sure
        (b'{"type":"response.created","response":{"error":null}}', True),  # read, not ending
    ],
)
def test_an_event_that_may_end_the_answer_is_read_whatever_its_sse_name(
    data: bytes, read: bool
) -> None:
    assert SOCKET.may_end(data) is read


def test_a_refusal_reads_as_the_error_event_a_socket_client_gets() -> None:
    error = {"type": "invalid_request_error", "code": "x", "message": "no", "param": "input"}
    headers = {"retry-after": "3", "x-request-id": "req_1", "set-cookie": "s"}
    event = SOCKET.error_event(429, {"error": error}, headers)
    assert event == {
        "type": "error",
        "status": 429,
        "error": error,
        "headers": {"retry-after": "3", "x-request-id": "req_1"},
    }
    plain = SOCKET.error_event(502, "Bad Gateway", {})
    assert plain["status"] == 502 and plain["error"]["message"] == "Bad Gateway"
    assert plain["error"]["type"] == "api_error"
    assert SOCKET.error_event(500, "", {})["error"]["message"] == "The request failed (500)."


def test_each_frames_request_carries_the_handshakes_headers_less_the_connections() -> None:
    handshake = {
        "Host": "proxy:8080",
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "k",
        "Sec-WebSocket-Version": "13",
        "Content-Length": "0",
        "Authorization": "Bearer sk-a",
        "session_id": "s1",
        "OpenAI-Beta": "responses_websockets=2026-02-06",
    }
    assert loopback_headers(handshake) == {
        "Authorization": "Bearer sk-a",
        "session_id": "s1",
        "OpenAI-Beta": "responses_websockets=2026-02-06",
        "Content-Type": "application/json",
    }


def test_a_key_sent_as_a_subprotocol_becomes_the_requests_authorization() -> None:
    browser = {"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.sk-b"}
    assert loopback_headers(browser)["Authorization"] == "Bearer sk-b"
    anthropic = {"x-api-key": "sk-c", **browser}
    assert "Authorization" not in loopback_headers(anthropic)


frame_bodies = st.fixed_dictionaries(
    {"model": st.just("m") | junk},
    optional={
        "input": st.lists(items, max_size=4) | texts(10) | junk,
        "previous_response_id": st.sampled_from(["resp_1", "resp_2"]) | junk,
        "tools": junk,
        "n": st.integers(min_value=-(2**70), max_value=2**70),  # past 64 bits, kept whole
    },
)


@settings(max_examples=400, deadline=None)
@given(turns=st.lists(st.tuples(frame_bodies, st.lists(items, max_size=3)), max_size=5))
def test_each_request_written_is_the_body_it_stands_for_turn_after_turn(
    turns: list[tuple[dict[str, Any], list[Any]]],
) -> None:
    """Written piece by piece after the JSON of the history it continues, a request reads as
    the whole body it stands for written at once, whatever came before on the connection."""
    last: SocketResponse | None = None
    for number, (frame, output) in enumerate(turns, start=1):
        if frame.get("previous_response_id") == "resp_1" and last is not None:
            frame = {**frame, "previous_response_id": last.response_id}
        request = SOCKET.http_request(frame, last)
        assert request.body == http_body(frame, last)
        # Read as the body written whole reads (a string of surrogate halves reads joined).
        assert jsonio.loads(request.raw) == jsonio.loads(jsonio.dumps(request.body))
        done = {"type": "response.completed", "response": {"id": f"r{number}", "output": output}}
        last = SOCKET.continued_by(done, request) or last
