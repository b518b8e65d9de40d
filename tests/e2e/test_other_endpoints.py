"""Every other OpenAI endpoint a client calls goes through as sent, with the real openai SDK:
the upstream receives the client's exact bytes and the client the upstream's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.encodings import compressed
from tests.helpers import counter

pytest.importorskip("openai")

import openai


class Capture:
    """The bodies the SDK sends, as it sends them (an httpx request hook)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, request: httpx.Request) -> None:
        self.bodies.append(await request.aread())


@pytest.fixture
async def capture() -> Capture:
    return Capture()


@pytest.fixture
async def sdk(proxy: RunningProxy, capture: Capture) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx.AsyncClient(event_hooks={"request": [capture]})
    async with openai.AsyncOpenAI(
        base_url=proxy.url, api_key="sk-other", max_retries=0, http_client=http
    ) as client:
        yield client


def passed(path: str, method: str, outcome: str) -> float:
    labels = {"path": path, "method": method, "outcome": outcome}
    return counter("compaction_proxy_passthrough_requests_total", **labels)


async def test_embeddings_reach_the_upstream_and_come_back_byte_for_byte(
    sdk: openai.AsyncOpenAI, capture: Capture, fake: FakeUpstream
) -> None:
    before = passed("/v1/embeddings", "POST", "2xx")
    raw = await sdk.embeddings.with_raw_response.create(
        model="text-embedding-3-small", input=["first text", "second text"]
    )
    assert fake.endpoints.requests[-1].body == capture.bodies[-1]
    assert raw.content == fake.endpoints.sent[-1]
    result = raw.parse()
    assert [d.index for d in result.data] == [0, 1] and len(result.data[0].embedding) == 8
    assert passed("/v1/embeddings", "POST", "2xx") == before + 1


async def test_a_compressed_body_relayed_unread_goes_on_compressed_with_its_coding(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """A body the proxy does not read (not JSON) is streamed as it came: the upstream gets the
    client's bytes and the ``Content-Encoding`` that says how to read them."""
    body = b'{"model": "text-embedding-3-small", "input": "compressed text"}'
    headers = {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{proxy.url}/embeddings", data=compressed(body, "gzip"), headers=headers
        ) as answer:
            assert answer.status == 200
    received = fake.endpoints.requests[-1]
    assert received.headers["Content-Encoding"] == "gzip"
    assert received.body == body  # the upstream (an aiohttp server) decoded it


async def test_a_model_is_retrieved_and_a_missing_one_is_the_upstreams_404(
    sdk: openai.AsyncOpenAI, fake: FakeUpstream
) -> None:
    model = await sdk.models.retrieve("fake-model")
    assert model.id == "fake-model"
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.models.retrieve("missing-model")
    assert missing.value.code == "model_not_found"
    assert fake.endpoints.requests[-1].path == "/v1/models/missing-model"
    assert passed("/v1/models/{id}", "GET", "4xx") >= 1


async def test_a_file_upload_and_its_content_pass_byte_for_byte(
    sdk: openai.AsyncOpenAI, capture: Capture, fake: FakeUpstream
) -> None:
    content = bytes(range(256)) * 400 + "\N{SNOWMAN} end".encode()
    uploaded = await sdk.files.create(file=("notes.bin", content), purpose="assistants")
    assert fake.endpoints.requests[-1].body == capture.bodies[-1]  # the multipart body as sent
    assert uploaded.bytes == len(content) and uploaded.filename == "notes.bin"
    downloaded = await sdk.files.content(uploaded.id)
    assert downloaded.content == content
    deleted = await sdk.files.delete(uploaded.id)  # any method
    assert deleted.deleted and fake.endpoints.requests[-1].method == "DELETE"
    assert fake.endpoints.requests[-2].path == f"/v1/files/{uploaded.id}/content"
    # Labelled by template: no file id ever becomes a label value.
    assert passed("/v1/files/{id}/content", "GET", "2xx") >= 1
    samples = REGISTRY.get_sample_value
    assert (
        samples(
            "compaction_proxy_passthrough_requests_total",
            {"path": f"/v1/files/{uploaded.id}/content", "method": "GET", "outcome": "2xx"},
        )
        is None
    )


async def test_a_streamed_answer_is_relayed_as_it_comes_and_whole(
    sdk: openai.AsyncOpenAI, fake: FakeUpstream
) -> None:
    # The upstream holds the rest of its answer back until the client has the first bytes:
    # through a proxy that buffered answers, the client would get nothing before the timeout.
    gate = fake.endpoints.speech_gate = asyncio.Event()
    try:
        async with asyncio.timeout(10):
            async with sdk.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input="Hello from the proxy"
            ) as response:
                chunks = response.iter_bytes()
                first = await anext(chunks)
                gate.set()
                rest = [chunk async for chunk in chunks]
    finally:
        gate.set()
    assert first + b"".join(rest) == fake.endpoints.sent[-1]


async def test_a_json_body_goes_to_its_models_route(
    make_proxy: ProxyFactory, upstream_url: str, aiohttp_server: Any
) -> None:
    other = FakeUpstream()
    other_url = str((await aiohttp_server(other.app())).make_url("/v1"))
    proxy = await make_proxy(
        routes=[
            {"model": "embed-*", "base_url": other_url},
            {"model": "*", "base_url": upstream_url},
        ]
    )
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-x", max_retries=0) as client:
        await client.embeddings.create(model="embed-large", input="routed")
    assert [r.path for r in other.endpoints.requests] == ["/v1/embeddings"]


async def test_an_unreachable_upstream_is_a_502_in_openais_shape(
    make_proxy: ProxyFactory,
) -> None:
    proxy = await make_proxy(upstream_base_url="http://127.0.0.1:9/v1")
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-x", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as failed:
            await client.embeddings.create(model="text-embedding-3-small", input="x")
    assert failed.value.status_code == 502
    assert failed.value.code == "upstream_unavailable"


@pytest.mark.parametrize("path", ["/v1/files/file-1/content", "/v1/models"])
async def test_a_redirect_is_the_clients_to_follow_never_the_proxys(
    make_proxy: ProxyFactory, aiohttp_server: Any, path: str
) -> None:
    """A signed download link, say: the client gets the redirect, and the proxy sends its
    credentials nowhere but the configured upstream."""
    followed: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/elsewhere"})

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(request.headers.get("Authorization", ""))
        return web.Response(body=b"followed")

    app = web.Application()
    app.router.add_get("/v1/files/file-1/content", redirect)
    app.router.add_get("/v1/models", redirect)
    app.router.add_get("/elsewhere", elsewhere)
    upstream = await aiohttp_server(app)
    proxy = await make_proxy(upstream_base_url=str(upstream.make_url("/v1")))
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{proxy.root}{path}",
            headers={"Authorization": "Bearer sk-other"},
            allow_redirects=False,
        ) as response,
    ):
        assert response.status == 302
        assert response.headers["Location"] == "/elsewhere"
    assert followed == []
