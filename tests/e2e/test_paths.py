"""A request path that leaves ``/v1/`` once normalized never reaches the upstream.

aiohttp routes on the path as it came, and the relay sends it on as the client encoded it, with
the route's key attached: ``/v1/../secret`` or ``/v1/%2e%2e/secret`` would reach the upstream's
``/secret``. Such a path, and an absolute-form request line, are refused with 400 in OpenAI's
error shape before anything is forwarded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory


@pytest.fixture
async def seen_upstream(aiohttp_server: Any) -> tuple[str, list[str]]:
    """An upstream that answers every path and remembers each as it arrived."""
    paths: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        paths.append(request.raw_path)
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    server: TestServer = await aiohttp_server(app)
    return str(server.make_url("/v1")), paths


async def send_raw(root: str, request_line: str) -> tuple[int, Any]:
    host, port = root.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"{request_line}\r\nHost: {host}\r\nAuthorization: Bearer sk-x\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, orjson.loads(body) if body.startswith(b"{") else body


@pytest.mark.parametrize(
    "target",
    [
        "/v1/../secret",
        "/v1/%2e%2e/secret",
        "/v1/%2E%2E/%2e%2e/admin",
        "/v1/files/..%2f..%2fadmin",
        "/v1/a/./../../x",
        "/v1/..",
        "/v1//../../x",
        "http://upstream.example/v1/models",
        "/v1/..;/secret",
        "/v1/%252e%252e/secret",
        "/v1/%c0%ae%c0%ae/secret",
        "/v1/%ef%bc%8e%ef%bc%8e/secret",
        "/v1/files%00/x",
    ],
)
async def test_a_path_that_leaves_v1_is_refused_before_forwarding(
    make_proxy: ProxyFactory, seen_upstream: tuple[str, list[str]], target: str
) -> None:
    upstream, paths = seen_upstream
    proxy = await make_proxy(upstream_base_url=upstream)
    status, body = await send_raw(proxy.root, f"GET {target} HTTP/1.1")
    assert status == 400, body
    assert body["error"]["code"] == "invalid_path" and body["error"]["param"] is None
    assert paths == []


@pytest.mark.parametrize("target", ["/v1/files/../models", "/v1/files/file-1%2Fcontent"])
async def test_a_path_that_stays_inside_v1_is_relayed_as_the_client_encoded_it(
    make_proxy: ProxyFactory, seen_upstream: tuple[str, list[str]], target: str
) -> None:
    upstream, paths = seen_upstream
    proxy = await make_proxy(upstream_base_url=upstream)
    status, _ = await send_raw(proxy.root, f"GET {target} HTTP/1.1")
    assert status == 200
    assert paths == [target]
