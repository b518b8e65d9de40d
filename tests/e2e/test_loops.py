"""The proxy never forwards to itself: refused at start, answered 508 when it happens anyway."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from compaction_proxy.config.settings import load_settings
from compaction_proxy.ops.app import create_app
from compaction_proxy.security.outbound import HOP_HEADER
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import user
from tests.conftest import ProxyFactory
from tests.processes import free_port

BODY = {"model": "fake-model", "messages": [user("hello")]}


async def test_every_forwarded_request_carries_the_hop_marker(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json=BODY) as response:
            assert response.status == 200
    (forwarded,) = [r for r in fake.received if r.path.endswith("/chat/completions")]
    assert forwarded.headers[HOP_HEADER] == "1"


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/chat/completions", "POST"),
        ("/responses", "POST"),
        ("/models", "GET"),
        ("/embeddings", "POST"),  # relayed unread
    ],
)
async def test_a_request_that_already_passed_a_proxy_is_answered_508(
    make_proxy: ProxyFactory, fake: FakeUpstream, path: str, method: str
) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as http:
        async with http.request(
            method, f"{proxy.url}{path}", json=BODY, headers={HOP_HEADER: "1"}
        ) as response:
            assert response.status == 508
            error = (await response.json())["error"]
    assert error["code"] == "loop_detected" and error["type"] and "param" in error
    assert fake.received == []


async def test_two_proxies_pointed_at_each_other_stop_after_one_hop(
    aiohttp_server: Any, fake: FakeUpstream
) -> None:
    """A loop start-up cannot see (two addresses) costs one extra hop, not hundreds."""
    port_a, port_b = free_port(), free_port()
    seen_by_b: list[str] = []

    def proxy_to(port: int) -> Any:
        settings = load_settings(
            None, upstream_base_url=f"http://127.0.0.1:{port}/v1", tenant_secret="t-secret"
        )
        return create_app(settings)

    app_b = proxy_to(port_a)

    @web.middleware
    async def count(request: web.Request, handler: Any) -> Any:
        seen_by_b.append(request.path)
        return await handler(request)

    app_b.middlewares.insert(0, count)
    await aiohttp_server(proxy_to(port_b), port=port_a)
    await aiohttp_server(app_b, port=port_b)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{port_a}/v1/chat/completions", json=BODY) as reply:
            assert reply.status == 508
            assert (await reply.json())["error"]["code"] == "loop_detected"
    assert seen_by_b == ["/v1/chat/completions"]


@pytest.mark.parametrize(
    ("host", "upstream", "refused"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080/v1", True),
        ("127.0.0.1", "http://localhost:8080/v1", True),
        ("0.0.0.0", "http://localhost:8080/v1", True),
        ("0.0.0.0", "http://127.0.0.1:8081/v1", False),
        ("127.0.0.1", "https://api.openai.com/v1", False),
        ("10.0.0.5", "http://127.0.0.1:8080/v1", False),
    ],
)
def test_start_up_refuses_an_upstream_at_the_proxys_own_address(
    host: str, upstream: str, refused: bool
) -> None:
    from compaction_proxy.security.self_forwarding import self_loop_problems

    settings = load_settings(None, host=host, port=8080, upstream_base_url=upstream)
    assert bool(self_loop_problems(settings)) is refused
