"""A client that leaves as soon as it has the terminal event (Codex closes at
``response.completed``, before the stream's own end) had its whole answer: the request counts
as ``ok``, not as a disconnect, and the usage the proxy saw is recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory
from tests.helpers import counter

USAGE = {"prompt_tokens": 1234, "completion_tokens": 5, "total_tokens": 1239}
CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def sse(event: Any) -> bytes:
    return b"data: " + (event if isinstance(event, bytes) else orjson.dumps(event)) + b"\n\n"


@pytest.fixture
async def lingering_upstream(aiohttp_server: Any) -> str:
    """Streams an answer and its usage chunk, then lingers a second before ``[DONE]``."""

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"role": "assistant", "content": "done"}
        await response.write(sse({**CHUNK, "choices": [{"index": 0, "delta": delta}]}))
        await response.write(sse({**CHUNK, "choices": [], "usage": USAGE}))
        await asyncio.sleep(1.0)
        await response.write(sse(b"[DONE]"))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    server: TestServer = await aiohttp_server(app)
    return str(server.make_url("/v1"))


async def test_a_client_leaving_after_the_usage_chunk_is_ok_and_its_usage_recorded(
    make_proxy: ProxyFactory, lingering_upstream: str
) -> None:
    proxy = await make_proxy(upstream_base_url=lingering_upstream)
    ok = counter("compaction_proxy_requests_total", route="*", outcome="ok")
    gone = counter("compaction_proxy_client_disconnects_total", route="*")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "go"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as http:
        response = await http.post(f"{proxy.url}/chat/completions", json=body)
        conversation = response.headers["X-Compaction-Conversation"]
        async for line in response.content:
            if b'"usage"' in line and b'"choices":[]' in line:
                break
        response.close()  # as Codex does: the answer is whole, the stream's end not awaited
    for _ in range(100):
        if counter("compaction_proxy_requests_total", route="*", outcome="ok") > ok:
            break
        await asyncio.sleep(0.05)
    assert counter("compaction_proxy_requests_total", route="*", outcome="ok") == ok + 1
    assert counter("compaction_proxy_client_disconnects_total", route="*") == gone
    usage = [e for e in await proxy.read_log(conversation) if e["type"] == "usage"]
    assert usage and usage[0]["prompt_tokens"] == 1234
