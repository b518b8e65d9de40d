"""WebSocket endpoints through the proxy: the Realtime API with the real openai SDK, and the
frames, subprotocols and close codes a relay must carry both ways."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from compaction_proxy.config.settings import load_settings
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.websocket_relay import offered_protocols
from compaction_proxy.ops.app import create_app
from compaction_proxy.security.outbound import HOP_HEADER
from compaction_proxy.testing.fake_upstream import FakeUpstream
from compaction_proxy.testing.memory_upstream import MemorySocket, MemoryUpstream
from compaction_proxy.upstream_seam import UpstreamRefused
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import counter
from tests.processes import free_port

pytest.importorskip("openai")
pytest.importorskip("websockets")  # the SDK's Realtime client

import openai


def sessions_counted() -> float:
    labels = {"path": "/v1/realtime", "method": "GET", "outcome": "websocket"}
    return counter("compaction_proxy_passthrough_requests_total", **labels)


async def closes_recorded(fake: FakeUpstream, count: int) -> list[int | None]:
    for _ in range(100):
        if len(fake.endpoints.realtime_closes) >= count:
            break
        await asyncio.sleep(0.02)
    return fake.endpoints.realtime_closes


async def test_the_realtime_sdk_holds_a_session_with_the_upstream_through_the_proxy(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    counted = sessions_counted()
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-voice", max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        created = orjson.loads(await connection.recv_bytes())
        assert created == {
            "type": "session.created",
            "event_id": "event_0",
            "model": "gpt-realtime",
        }
        update: dict[str, Any] = {"type": "session.update", "session": {"type": "realtime"}}
        await connection.send(update)  # type: ignore[arg-type]
        echoed = orjson.loads(await connection.recv_bytes())
        assert echoed["type"] == "fake.echo" and echoed["echo"] == update
    await client.close()
    (handshake,) = fake.endpoints.requests
    assert handshake.method == "GET"
    assert handshake.path == "/v1/realtime?model=gpt-realtime"
    assert handshake.headers["Authorization"] == "Bearer sk-voice"
    assert handshake.headers[HOP_HEADER] == "1"
    assert await closes_recorded(fake, 1) == [1000]
    for _ in range(100):  # counted once the handler returns, after the close
        if sessions_counted() == counted + 1:
            break
        await asyncio.sleep(0.02)
    assert sessions_counted() == counted + 1


async def test_frames_subprotocols_and_close_codes_pass_both_ways(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    url = f"{proxy.url}/realtime?model=gpt-realtime"
    # A browser's key travels as a subprotocol; the upstream picks "realtime".
    offered = ("realtime", "openai-insecure-api-key.sk-browser")
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url, protocols=offered) as ws:
            assert ws.protocol == "realtime"
            assert (await ws.receive_json())["type"] == "session.created"
            await ws.send_bytes(b"\x00\x01audio\xff")
            assert (await ws.receive_bytes()) == b"\x00\x01audio\xff"
            await ws.send_json({"type": "fake.close", "code": 4001})
            closing = await ws.receive()
            assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 4001
        async with http.ws_connect(url) as ws:
            assert ws.protocol is None  # offered nothing, got nothing
            await ws.receive_json()
            await ws.close(code=4002)
    # The provider's own close reads back the proxy's echo of it; the client's is 4002.
    assert (await closes_recorded(fake, 2))[1] == 4002
    first = fake.endpoints.requests[0]
    assert offered_protocols(first.headers["Sec-WebSocket-Protocol"]) == offered


async def test_a_refused_handshake_is_answered_with_the_upstreams_status(
    proxy: RunningProxy,
) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{proxy.url}/realtime?model=missing-model")
    assert refused.value.status == 404


async def test_an_unreachable_upstream_is_a_502_in_openais_shape(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(upstream_base_url=f"http://127.0.0.1:{free_port()}/v1")
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{proxy.url}/realtime?model=gpt-realtime")
        assert refused.value.status == 502
        async with http.get(
            f"{proxy.url}/realtime?model=gpt-realtime",
            headers={
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
        ) as answer:
            assert answer.status == 502
            assert (await answer.json())["error"]["code"] == "upstream_unavailable"


# Seconds: a side is taken for gone when a ping is not answered within half of it, which
# even a loaded machine's event loops manage.
HEARTBEAT = 0.5


@asynccontextmanager
async def session(
    make_proxy: ProxyFactory, heartbeat: float, autoping: bool = True
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A Realtime session through a proxy with this heartbeat, past ``session.created``; with
    ``autoping`` off, the client answers no ping unless the test does."""
    proxy = await make_proxy(websocket_heartbeat_seconds=heartbeat)
    async with aiohttp.ClientSession() as http:
        url = f"{proxy.url}/realtime?model=gpt-realtime"
        async with http.ws_connect(url, autoping=autoping) as ws:
            await ws.receive_json()
            yield ws


async def test_both_sides_of_an_idle_session_are_pinged(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    """Pings keep an idle session open through load balancers and NAT, on both sides."""
    async with session(make_proxy, HEARTBEAT, autoping=False) as ws:
        ping = await asyncio.wait_for(ws.receive(), 5)
        assert ping.type is aiohttp.WSMsgType.PING
        await ws.pong(ping.data)
        for _ in range(100):
            if fake.endpoints.realtime_pings:
                break
            await asyncio.sleep(0.02)
        assert fake.endpoints.realtime_pings >= 1
        await ws.send_json({"type": "still.here"})  # the session goes on
        assert (await ws.receive_json())["type"] == "fake.echo"


async def test_a_client_that_stops_answering_pings_is_taken_for_gone_and_the_upstream_closed(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    async with session(make_proxy, HEARTBEAT, autoping=False):
        # Never answered: the proxy gives up on this client, and tells the provider.
        assert await closes_recorded(fake, 1) == [1011]


async def test_a_provider_gone_silent_is_taken_for_gone_and_the_client_told_1011(
    make_proxy: ProxyFactory,
) -> None:
    async with session(make_proxy, HEARTBEAT) as ws:
        await ws.send_json({"type": "fake.mute"})
        closing = await asyncio.wait_for(ws.receive(), 5)
        assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 1011


async def test_no_pings_when_the_heartbeat_is_off(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    async with session(make_proxy, 0, autoping=False) as ws:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ws.receive(), 0.6)
    assert fake.endpoints.realtime_pings == 0


@pytest.fixture
async def seamed_proxy(aiohttp_server: Any) -> AsyncIterator[tuple[str, MemoryUpstream]]:
    """A proxy whose relay pool is in memory: its WebSocket sessions reach no socket."""
    memory = MemoryUpstream()
    app = create_app(load_settings(None, upstream_base_url="http://upstream.invalid/v1"))

    async def relayed_in_memory(app: web.Application) -> AsyncIterator[None]:
        app[SERVICES] = dataclasses.replace(app[SERVICES], relay_upstream=memory)
        yield

    app.cleanup_ctx.append(relayed_in_memory)
    server: TestServer = await aiohttp_server(app)
    yield str(server.make_url("/v1")), memory


async def test_a_websocket_session_goes_through_the_relay_seam_both_ways(
    seamed_proxy: tuple[str, MemoryUpstream],
) -> None:
    base, memory = seamed_proxy
    session, echoing = MemorySocket(protocol="realtime"), MemorySocket(echo=True)
    memory.sessions.extend([session, echoing])
    async with aiohttp.ClientSession() as http:
        url = f"{base}/realtime?model=gpt-realtime"
        async with http.ws_connect(url, protocols=("realtime",)) as ws:
            assert ws.protocol == "realtime"  # the upstream's choice
            session.say('{"type": "session.created"}')
            assert (await ws.receive_json())["type"] == "session.created"
            await ws.send_bytes(b"\x00audio")
            await ws.send_str("text")
            for _ in range(100):
                if len(session.sent) == 2:
                    break
                await asyncio.sleep(0.01)
            assert session.sent == [b"\x00audio", "text"]
            session.hang_up(4001)
            closing = await ws.receive()
            assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 4001
        async with http.ws_connect(url) as ws:  # closed by the client
            await ws.send_str("ping me")
            assert await ws.receive_str() == "ping me"
            await ws.close(code=4002)
    (handshake, second) = memory.socket_calls
    assert handshake.url.path == "/v1/realtime" and handshake.url.query["model"] == "gpt-realtime"
    assert handshake.protocols == ("realtime",) and second.protocols == ()
    for _ in range(100):  # the relay closes the upstream side once the client's close is in
        if echoing.closed_with is not None:
            break
        await asyncio.sleep(0.01)
    assert echoing.closed_with == 4002
    assert session.closed_with is None  # it hung up itself; the proxy did not close it again


async def test_a_handshake_the_seam_refuses_or_cannot_reach_is_answered_in_openais_shape(
    seamed_proxy: tuple[str, MemoryUpstream],
) -> None:
    base, memory = seamed_proxy
    memory.sessions.extend([UpstreamRefused(403), ConnectionRefusedError("no one there")])
    async with aiohttp.ClientSession() as http:
        for status, code in ((403, "websocket_refused"), (502, "upstream_unavailable")):
            async with http.get(
                f"{base}/realtime?model=gpt-realtime",
                headers={"Upgrade": "websocket", "Connection": "Upgrade"},
            ) as answer:
                assert answer.status == status
                assert (await answer.json())["error"]["code"] == code
