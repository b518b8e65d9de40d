"""Responses over a WebSocket (``GET /v1/responses`` upgraded), with the real openai SDK's
``responses.connect()``: every turn served as the HTTP request it stands for, so compacted like
any other; a frame continuing the connection's last response carries its whole history; a
prewarm answered without the upstream; errors as the provider's ``error`` events; the other
compacted endpoints refuse a socket with 426."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.security.loopback import LOOPBACK_CLIENT_HEADER
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import MASKING_OFF, counter, route

pytest.importorskip("openai")

import openai

from tests.e2e.test_responses import CUT, MODEL, TOOLS, WINDOW, observation

ENDS = ("response.completed", "response.incomplete", "response.failed", "error")


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream) -> RunningProxy:
    fake.windows[MODEL] = WINDOW
    fake.responses.tool_rounds = 1_000
    policy = {"precompact_ratio": 0, **MASKING_OFF}
    return await make_proxy(routes=[route(upstream_url, "resp-*", WINDOW, **policy)])


def socket_url(proxy: RunningProxy, path: str = "/responses") -> str:
    return proxy.url.replace("http://", "ws://") + path


async def turn(connection: Any, event: dict[str, Any]) -> list[Any]:
    """The events answering one ``response.create``, up to the one that ends it."""
    await connection.send(event)
    events = []
    while True:
        events.append(await connection.recv())
        if events[-1].type in ENDS:
            return events


async def test_a_socket_session_continuing_each_response_is_compacted_like_http(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """Codex's way: each frame names the last response and sends only what is new. The
    upstream gets every turn as a whole history over HTTP (never an id it did not make), and
    the history outgrows the 16k window: the proxy cuts it, and no turn overflows."""
    served = counter("compaction_proxy_requests_total", route="resp-*", outcome="ok")
    sessions = counter("compaction_proxy_socket_sessions_total", format="responses")
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    async with client.responses.connect() as connection:
        opening = {"role": "user", "content": "Read the files, one step at a time."}
        event: dict[str, Any] = {"type": "response.create", "model": MODEL, "tools": TOOLS}
        events = await turn(connection, {**event, "input": [opening], "store": False})
        for step in range(12):
            done = events[-1]
            assert done.type == "response.completed", done
            (call,) = done.response.output
            output = {"type": "function_call_output", "call_id": call.call_id}
            new = [{**output, "output": observation(step)}]
            continuing = {**event, "previous_response_id": done.response.id, "store": False}
            events = await turn(connection, {**continuing, "input": new})
        assert events[-1].type == "response.completed", events[-1]
    forwarded = fake.responses.forwarded
    assert len(forwarded) == 13
    assert all("previous_response_id" not in body for body in forwarded)
    # The second turn as the upstream got it: the whole history, the first turn's included.
    assert forwarded[1]["input"][0] == opening and len(forwarded[1]["input"]) == 3
    compacted = (CUT, "<compacted-summary>")
    assert any(mark in str(body["input"]) for body in forwarded for mark in compacted)
    assert fake.responses.overflows == [] and fake.responses.refused == []
    assert counter("compaction_proxy_requests_total", route="resp-*", outcome="ok") > served
    assert counter("compaction_proxy_socket_sessions_total", format="responses") == sessions + 1


async def test_a_prewarm_is_answered_without_the_upstream_and_continued_from(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    developer = {"role": "developer", "content": "You are a careful agent."}
    task = {"role": "user", "content": "Say hello."}
    async with client.responses.connect() as connection:
        warm = {"type": "response.create", "model": MODEL, "input": [developer]}
        events = await turn(connection, {**warm, "generate": False})
        assert [e.type for e in events] == ["response.created", "response.completed"]
        assert fake.responses.received == []
        prewarmed = events[-1].response.id
        events = await turn(
            connection,
            {**warm, "previous_response_id": prewarmed, "input": [task]},
        )
    assert events[-1].type == "response.completed"
    (body,) = fake.responses.received
    assert body["input"] == [developer, task]
    assert body["stream"] is True


async def raw_turn(socket: aiohttp.ClientWebSocketResponse, frame: bytes) -> list[Any]:
    await socket.send_str(frame.decode())
    events = []
    while True:
        events.append(orjson.loads((await socket.receive(timeout=20)).data))
        if events[-1]["type"] in ENDS:
            return events


async def test_frames_that_are_no_request_get_error_events_and_the_socket_goes_on(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """Not JSON, another event type, a request the endpoint refuses, the window overflowed:
    each an ``error`` event with the status and the error object an HTTP client would get;
    then a good frame is served on the same socket."""
    fake.windows[MODEL] = 50
    async with (
        aiohttp.ClientSession(headers={"Authorization": "Bearer sk-test"}) as session,
        session.ws_connect(socket_url(proxy)) as socket,
    ):
        (error,) = await raw_turn(socket, b"{not json")
        assert error["status"] == 400 and error["error"]["type"] == "invalid_request_error"
        (error,) = await raw_turn(socket, b'{"type": "response.steer"}')
        assert error["status"] == 400 and "response.steer" in error["error"]["message"]
        create = {"type": "response.create", "model": MODEL}
        (error,) = await raw_turn(socket, orjson.dumps({**create, "input": 7}))
        assert error["status"] == 400 and error["error"]["param"] == "input"
        long = "a thousand words " * 300
        (error,) = await raw_turn(socket, orjson.dumps({**create, "input": long}))
        assert error["status"] == 400
        assert error["error"]["code"] == "context_length_exceeded", error
        events = await raw_turn(socket, orjson.dumps({**create, "input": "Hi."}))
        assert events[-1]["type"] == "response.completed"


async def test_an_answer_the_upstream_cuts_short_ends_in_an_error_event(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """Over HTTP the client would see its stream end short; on a socket nothing ends, so the
    proxy says it: a 502 ``error`` event after what came, and the socket goes on."""
    fake.responses.cut_streams = 1
    async with (
        aiohttp.ClientSession(headers={"Authorization": "Bearer sk-test"}) as session,
        session.ws_connect(socket_url(proxy)) as socket,
    ):
        create = orjson.dumps({"type": "response.create", "model": MODEL, "input": "Hi."})
        events = await raw_turn(socket, create)
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "error" and events[-1]["status"] == 502, events
        events = await raw_turn(socket, create)
        assert events[-1]["type"] == "response.completed"


@pytest.mark.parametrize("path", ["/chat/completions", "/messages"])
async def test_a_socket_on_an_endpoint_served_over_http_alone_is_refused_with_426(
    proxy: RunningProxy, fake: FakeUpstream, path: str
) -> None:
    """426: what Codex takes for "send it over HTTP", at once. Nothing reaches the upstream."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(socket_url(proxy, path))
    assert refused.value.status == 426
    assert fake.received == []


async def test_a_plain_get_on_the_responses_path_goes_on_as_sent(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(proxy.url + "/responses", headers={"Authorization": "Bearer sk-x"}) as got,
    ):
        assert got.status == 405  # the fake upstream's answer to a GET there, relayed


async def test_each_keyless_socket_client_is_named_by_its_own_address(
    proxy: RunningProxy, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame's request reaches this process over loopback: still, a client without a key
    takes its upstream share by its own address (here 127.0.0.2), not by the proxy's, and
    the vouch for it never goes upstream."""
    shares = proxy.app[SERVICES].upstream_shares
    named: list[Any] = []
    took = shares.took
    monkeypatch.setattr(shares, "took", lambda client: named.append(client) or took(client))
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.ws_connect(socket_url(proxy)) as socket,
    ):
        create = orjson.dumps({"type": "response.create", "model": MODEL, "input": "Hi."})
        events = await raw_turn(socket, create)
        assert events[-1]["type"] == "response.completed"
    assert named == [("address", "127.0.0.2")]
    (sent,) = fake.responses.headers_received
    assert LOOPBACK_CLIENT_HEADER.lower() not in {name.lower() for name in sent}


async def test_a_client_sending_the_vouch_header_itself_keeps_its_own_address(
    proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vouch this process did not make (a bare address, a wrong MAC, text that is no MAC)
    names nobody: the request keeps the address it came from."""
    shares = proxy.app[SERVICES].upstream_shares
    named: list[Any] = []
    took = shares.took
    monkeypatch.setattr(shares, "took", lambda client: named.append(client) or took(client))
    forged = ["0" * 64 + " 10.9.9.9", "10.9.9.9", "é ✓ 10.9.9.9", ""]
    async with aiohttp.ClientSession() as session:
        for value in forged:
            body = {"model": MODEL, "input": "Hi.", "stream": False}
            headers = {LOOPBACK_CLIENT_HEADER: value}
            async with session.post(f"{proxy.url}/responses", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
    assert named == [("address", "127.0.0.1")] * len(forged)
