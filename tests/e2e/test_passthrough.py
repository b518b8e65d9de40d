"""The spine end to end: the real openai SDK, the proxy, the fake upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from yarl import URL

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory
from tests.helpers import counter

pytest.importorskip("openai")

import openai

MODEL = "fake-model"


def history() -> list[dict[str, Any]]:
    return [system(), user("Fix the failing test in parser.py"), *agent_turns(3)]


async def test_plain_completion_passes_through_with_conversation_headers(
    client: openai.AsyncOpenAI, fake: FakeUpstream
) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=history(),
        temperature=0.3,  # type: ignore[arg-type]
        extra_body={"vendor_option": {"keep": [1, None, "x"]}},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "ok"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == fake.chat_requests[0].prompt_tokens
    assert raw.headers["x-compaction-status"] == "none"
    assert raw.headers["x-compaction-conversation"]
    assert raw.headers["x-request-id"].startswith("req_fake_")
    assert raw.headers["x-ratelimit-remaining-requests"] == "9999"
    forwarded = fake.chat_requests[0].body
    assert forwarded == {
        "model": MODEL,
        "messages": history(),
        "temperature": 0.3,
        "vendor_option": {"keep": [1, None, "x"]},
    }


async def test_sync_client_works_through_the_proxy(proxy_url: str, fake: FakeUpstream) -> None:
    def call() -> str | None:
        with openai.OpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0) as sync:
            reply = sync.chat.completions.create(model=MODEL, messages=history())  # type: ignore[arg-type]
            return reply.choices[0].message.content

    assert await asyncio.to_thread(call) == "ok"
    assert len(fake.chat_requests) == 1


@pytest.mark.parametrize("include_usage", [False, True])
async def test_streaming_is_relayed_chunk_by_chunk(
    client: openai.AsyncOpenAI, fake: FakeUpstream, include_usage: bool
) -> None:
    fake.reply = lambda body: "streamed answer from the fake upstream"
    options = {"include_usage": True} if include_usage else None
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=history(),
        stream=True,  # type: ignore[arg-type]
        stream_options=options,  # type: ignore[arg-type]
    )
    pieces: list[str] = []
    usage = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == "streamed answer from the fake upstream"
    assert len(pieces) == fake.stream_pieces
    if include_usage:
        assert usage is not None
        assert usage.prompt_tokens == fake.chat_requests[0].prompt_tokens
    else:
        assert usage is None


async def test_stream_bytes_reach_the_client_unchanged_including_done(
    proxy_url: str, fake: FakeUpstream
) -> None:
    fake.reply = lambda body: "eight ch"
    body = {
        "model": MODEL,
        "messages": history(),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy_url}/chat/completions", json=body) as response:
            assert response.content_type == "text/event-stream"
            received = await response.read()
    assert received.endswith(b"data: [DONE]\n\n")
    events = [line for line in received.split(b"\n\n") if line]
    assert len(events) == fake.stream_pieces + 4


async def test_tool_calls_in_history_are_forwarded_unchanged(
    client: openai.AsyncOpenAI, fake: FakeUpstream
) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    await client.chat.completions.create(
        model=MODEL,
        messages=history(),
        tools=tools,
        tool_choice="auto",  # type: ignore[arg-type]
    )
    forwarded = fake.chat_requests[0].body
    assert forwarded is not None
    assert forwarded["messages"] == history()
    assert forwarded["tools"] == tools


@pytest.mark.parametrize(
    ("status", "body", "content_type", "error"),
    [
        (
            404,
            b'{"error": {"message": "The model does not exist", "type": "invalid_request_error",'
            b' "param": null, "code": "model_not_found"}}',
            "application/json",
            openai.NotFoundError,
        ),
        (
            400,
            b'{"error": {"message": "bad temperature", "type": "invalid_request_error",'
            b' "param": "temperature", "code": null}}',
            "application/json",
            openai.BadRequestError,
        ),
        (503, b"upstream overloaded, try later", "text/plain", openai.InternalServerError),
        (
            500,
            b'{"error": {"message": "internal", "type": "server_error"}}',
            "application/json",
            openai.InternalServerError,
        ),
    ],
)
async def test_upstream_errors_reach_the_client_unchanged(
    client: openai.AsyncOpenAI,
    proxy_url: str,
    fake: FakeUpstream,
    status: int,
    body: bytes,
    content_type: str,
    error: type[openai.APIStatusError],
) -> None:
    fake.fail_next(status, body, content_type)
    with pytest.raises(error) as caught:
        await client.chat.completions.create(model=MODEL, messages=history())  # type: ignore[arg-type]
    assert caught.value.status_code == status
    assert caught.value.response.content == body

    fake.fail_next(status, body, content_type)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy_url}/chat/completions", json={"model": MODEL, "messages": history()}
        ) as response,
    ):
        assert response.status == status
        assert response.content_type == content_type
        assert await response.read() == body
        assert response.headers["x-request-id"].startswith("req_fake_")


async def test_an_upstream_cookie_reaches_its_client_and_is_never_sent_for_another(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    # By name, not address: a cookie jar would keep a cookie for "localhost" (never for an IP).
    proxy = await make_proxy(upstream_base_url=upstream_url.replace("127.0.0.1", "localhost"))
    fake.reply_headers["Set-Cookie"] = "__cf_bm=client-a; Path=/; HttpOnly"
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as first:
        raw = await first.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
        )
    assert raw.headers["set-cookie"] == "__cf_bm=client-a; Path=/; HttpOnly"
    del fake.reply_headers["Set-Cookie"]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-b", max_retries=0) as second:
        await second.chat.completions.create(model=MODEL, messages=history())  # type: ignore[arg-type]
        await second.models.list()
    assert len(fake.chat_requests) == 2
    assert all("Cookie" not in received.headers for received in fake.received)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_an_upstream_redirect_reaches_the_client_as_sent(
    proxy_url: str, fake: FakeUpstream, status: int
) -> None:
    # Followed, it would land on an endpoint that answers: the proxy must not go there.
    location = "/v1/embeddings"
    fake.fail_next(status, b"", headers={"Location": location})
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy_url}/chat/completions",
            json={"model": MODEL, "messages": history()},
            allow_redirects=False,
        ) as response,
    ):
        assert response.status == status
        assert response.headers["Location"] == location
    assert [received.path for received in fake.received] == ["/v1/chat/completions"]
    assert fake.endpoints.requests == []


async def test_the_clients_query_string_reaches_the_upstream_as_it_encoded_it(
    proxy_url: str, fake: FakeUpstream
) -> None:
    # Azure's api-version, a gateway's own parameters: dropped, the upstream refuses the call.
    version = {"api-version": "2025-04-01-preview"}
    async with openai.AsyncOpenAI(
        base_url=proxy_url, api_key="sk-test", max_retries=0, default_query=version
    ) as client:
        await client.chat.completions.create(model=MODEL, messages=history())  # type: ignore[arg-type]
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
            stream=True,
        )
        async for _chunk in stream:
            pass
        await client.models.list()
    assert [r.query for r in fake.received] == ["api-version=2025-04-01-preview"] * 3
    exact = "v=1&path=a%2Fb&empty="
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            URL(f"{proxy_url}/chat/completions?{exact}", encoded=True),
            json={"model": MODEL, "messages": history()},
        ) as response,
    ):
        assert response.status == 200
    assert fake.received[-1].query == exact


async def test_client_disconnect_mid_stream_cancels_the_upstream_request(
    client: openai.AsyncOpenAI, fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:

    def disconnects() -> float:
        name = "compaction_proxy_client_disconnects_total"
        return counter(name, route="*")

    before = disconnects()
    fake.stream_pieces = 50
    fake.stream_delay = 0.05
    fake.reply = lambda body: "x" * 200
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=history(),
        stream=True,  # type: ignore[arg-type]
    )
    async for _chunk in stream:
        break
    await stream.close()
    for _ in range(100):
        if fake.disconnects and disconnects() > before:
            break
        await asyncio.sleep(0.05)
    assert fake.disconnects == 1
    # Named as what it is, and counted: not an upstream failure.
    assert disconnects() == before + 1
    assert not [r for r in caplog.records if "upstream stream broke off" in r.getMessage()]


BAD_BODIES = [
    (b"{not json", 400, None),
    (b'{"model": "m"}', 400, "messages"),
    (b'{"model": "m", "messages": "hello"}', 400, "messages"),
    (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}', 400, "messages[0].role"),
]


@pytest.mark.parametrize(("raw", "status", "param"), BAD_BODIES)
async def test_bad_input_gets_an_openai_error_and_nothing_is_forwarded(
    proxy_url: str, fake: FakeUpstream, raw: bytes, status: int, param: str | None
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{proxy_url}/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == status
            error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    assert fake.received == []


async def test_invalid_session_header_is_rejected(
    client: openai.AsyncOpenAI, fake: FakeUpstream
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
            extra_headers={"X-Session-Id": "not valid/!"},
        )
    assert caught.value.param == "X-Session-Id"  # type: ignore[attr-defined]
    assert fake.received == []


async def test_oversized_body_gets_413(make_proxy: ProxyFactory, fake: FakeUpstream) -> None:
    proxy_url = (await make_proxy(max_body_bytes=10_000)).url
    async with openai.AsyncOpenAI(base_url=proxy_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model=MODEL,
                messages=[user("x" * 20_000)],
            )
        assert caught.value.status_code == 413
        body = orjson.loads(caught.value.response.content)
        assert body["error"]["code"] == "request_too_large"
        reply = await client.chat.completions.create(model=MODEL, messages=[user("x" * 100)])
        assert reply.choices[0].message.content == "ok"
    assert len(fake.received) == 1


async def test_session_header_names_the_conversation(client: openai.AsyncOpenAI) -> None:
    async def conversation_of(messages: list[dict[str, Any]], session: str | None) -> str:
        headers = {"X-Session-Id": session} if session else {}
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            extra_headers=headers,  # type: ignore[arg-type]
        )
        return raw.headers["x-compaction-conversation"]

    base = history()
    derived = await conversation_of(base, None)
    assert await conversation_of([*base, user("more")], None) == derived
    named = await conversation_of(base, "run-42")
    assert named != derived
    assert await conversation_of([system(), user("other")], "run-42") == named


async def test_models_are_listed_from_the_upstream(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]


async def test_unreachable_upstream_gives_502_in_openai_shape(make_proxy: ProxyFactory) -> None:
    proxy_url = (await make_proxy(upstream_base_url="http://127.0.0.1:9/v1")).url
    async with openai.AsyncOpenAI(base_url=proxy_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=MODEL, messages=history())  # type: ignore[arg-type]
    assert caught.value.status_code == 502
    assert orjson.loads(caught.value.response.content)["error"]["code"] == "upstream_unavailable"


async def test_health_endpoints(proxy_url: str) -> None:
    root = proxy_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz"):
            async with http.get(root + path) as response:
                assert response.status == 200
