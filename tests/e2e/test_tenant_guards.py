"""No tenant can switch compaction off for another: its rate limits and refused keys are its
own, and it cannot burn the route's summary ceiling with keys nobody checked. Nor can it make
the proxy cut another's requests: what its usage teaches the meter is its own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from compaction_proxy.testing.fake_answers import is_summary_request
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import MASKING_OFF, counter, route

pytest.importorskip("openai")

import openai

WINDOW = 16_000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def history() -> list[dict[str, Any]]:
    """About 14k tokens: above the 12.8k threshold, inside the 16k window."""
    return [
        system(),
        user(f"FACT-5: ticket {uuid.uuid4().hex[:6]}. Make the importer idempotent."),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
    ]


def error(status: int, message: str, code: str, **headers: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return web.json_response(body, status=status, headers=headers)


@pytest.fixture
async def summary_keys(fake: FakeUpstream, aiohttp_server: Any) -> tuple[str, list[str]]:
    """The fake provider behind rules of its own for summary calls, as OpenAI answers them:
    the attacker's key is rate-limited (429 with a Retry-After) and keys it never issued are
    refused (401). The keys of every summary call, in order."""
    keys: list[str] = []

    @web.middleware
    async def provider_rules(request: web.Request, handler: Handler) -> web.StreamResponse:
        summary = request.path.endswith("/chat/completions") and is_summary_request(
            orjson.loads(await request.read())
        )
        if summary:
            key = request.headers.get("Authorization", "").removeprefix("Bearer ")
            keys.append(key)
            if key == "sk-attacker":
                return error(
                    429, "Rate limit reached", "rate_limit_exceeded", **{"Retry-After": "60"}
                )
            if key.startswith("sk-random-"):
                return error(401, "Incorrect API key provided", "invalid_api_key")
            if key.startswith("sk-unfunded-"):
                return error(
                    429,
                    "You exceeded your current quota, please check your plan and billing details.",
                    "insufficient_quota",
                )
        return await handler(request)

    app = fake.app()
    app.middlewares.append(provider_rules)
    server: TestServer = await aiohttp_server(app)
    return str(server.make_url("/v1")), keys


async def ask(proxy: RunningProxy, key: str) -> tuple[int, str]:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=key, max_retries=0) as client:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="small-model",
                messages=history(),  # type: ignore[arg-type]
            )
        except openai.APIStatusError as failed:
            return failed.status_code, failed.response.headers.get("x-compaction-status", "")
        return raw.http_response.status_code, raw.headers["x-compaction-status"]


async def test_a_tenant_rate_limited_on_its_summaries_does_not_stop_anothers_compaction(
    make_proxy: ProxyFactory, summary_keys: tuple[str, list[str]]
) -> None:
    upstream, keys = summary_keys
    proxy = await make_proxy(
        routes=[route(upstream, "small-*", WINDOW, precompact_ratio=0, **MASKING_OFF)]
    )
    for _ in range(3):
        assert (await ask(proxy, "sk-attacker"))[1] != "compacted"
    # Its Retry-After is honoured: one summary call, then it waits.
    assert keys == ["sk-attacker"]
    assert await ask(proxy, "sk-victim") == (200, "compacted")


@pytest.mark.parametrize(
    "prefix",
    ["sk-random-", "sk-unfunded-"],
    ids=["keys the upstream refuses (401)", "keys out of quota (429 insufficient_quota)"],
)
async def test_keys_whose_own_calls_fail_cannot_burn_the_routes_summary_ceiling(
    make_proxy: ProxyFactory, summary_keys: tuple[str, list[str]], prefix: str
) -> None:
    """A summary call refused for the caller's own key (its credential, its quota) counts
    against that key alone, never the route's ceiling."""
    upstream, keys = summary_keys
    proxy = await make_proxy(
        routes=[route(upstream, "small-*", WINDOW, precompact_ratio=0, **MASKING_OFF)],
        summaries_per_minute_per_route=10,
    )
    for n in range(25):
        _, compaction = await ask(proxy, f"{prefix}{n % 20}")
        assert compaction != "compacted"
    # One summary call per key: a key refused once is remembered as refused.
    assert sorted(keys) == sorted({f"{prefix}{n}" for n in range(20)})
    assert await ask(proxy, "sk-victim") == (200, "compacted")


async def test_a_tenant_whose_content_the_meter_undercounts_does_not_get_anothers_cut(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Tenant A's conversations carry what the upstream counts at three times the meter's
    estimate (screenshots do: an image part is metered at 85 tokens and billed at up to
    thousands). Its first requests teach the meter a ratio of 3 for the model; tenant B's
    first request, about 10k tokens in a 16k window, must still go whole, as it would
    without the proxy (scaled by A's ratio it would be estimated past the window and cut)."""
    counted = fake.count_text
    fake.count_text = lambda text: 3 * counted(text) if "SCREENSHOT" in text else counted(text)  # type: ignore[method-assign]
    proxy = await make_proxy(routes=[route(upstream_url, "small-*", WINDOW, **MASKING_OFF)])

    async def first_request(key: str, output: str) -> tuple[str, int]:
        messages = [
            system(),
            user(f"Ticket {uuid.uuid4().hex[:6]}: make the importer idempotent."),
            *agent_turns(20, output=output),
        ]
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key=key, max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="small-model",
                messages=messages,  # type: ignore[arg-type]
            )
        return raw.headers["x-compaction-status"], fake.chat_requests[-1].prompt_tokens

    for _ in range(4):
        await first_request("sk-tenant-a", "SCREENSHOT " + "pixel " * 30)
    status, forwarded = await first_request("sk-tenant-b", "importer log line " * 160)
    assert status == "none"
    assert 9_000 < forwarded < 12_800


def openai_error(message: str) -> dict[str, Any]:
    return {"message": message, "type": "invalid_request_error", "param": None, "code": None}


# The chat arguments the fake provider below knows; any other is refused as OpenAI does.
CHAT_ARGUMENTS = frozenset(
    {"model", "messages", "stream", "stream_options", "tools", "tool_choice", "max_tokens"}
)


async def proxy_told_a_limit(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any, argument: str
) -> RunningProxy:
    """A proxy before the fake provider, which refuses an argument it does not know as OpenAI
    does (400, "Unrecognized request argument supplied: <its name>"), once tenant A ("sk-a")
    has named ``argument``: the proxy reads that refusal as a context overflow if the name
    says one."""

    @web.middleware
    async def unknown_arguments(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            unknown = sorted(set(orjson.loads(await request.read())) - CHAT_ARGUMENTS)
            if unknown:
                message = f"Unrecognized request argument supplied: {unknown[0]}"
                return web.json_response({"error": openai_error(message)}, status=400)
        return await handler(request)

    app = fake.app()
    app.middlewares.append(unknown_arguments)
    server: TestServer = await aiohttp_server(app)
    upstream = str(server.make_url("/v1"))
    proxy = await make_proxy(routes=[route(upstream, "small-*", WINDOW, **MASKING_OFF)])
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError, match="Unrecognized request argument"):
            await client.chat.completions.create(
                model="small-model",
                messages=[user("hello")],  # type: ignore[list-item]
                extra_body={argument: 1},
            )
    return proxy


async def test_a_limit_read_from_a_tenants_own_words_does_not_cut_anothers_requests(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """Tenant A names an argument "maximum context length is 1000", and the proxy reads a
    context overflow stating a 1,000-token window: what A's own request then goes through is
    A's affair. Tenant B's request, about 10k tokens in a 16k window, must still go whole (cut
    to a thousand tokens before the limit was kept per tenant)."""
    argument = "maximum context length is 1000"
    proxy = await proxy_told_a_limit(make_proxy, fake, aiohttp_server, argument)
    messages = [
        system(),
        user(f"Ticket {uuid.uuid4().hex[:6]}: make the importer idempotent."),
        *agent_turns(20, output="importer log line " * 160),
    ]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-b", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="small-model",
            messages=messages,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "none"
    assert (fake.chat_requests[-1].body or {})["messages"] == messages


async def test_a_limit_of_zero_tokens_in_a_tenants_own_words_teaches_nothing(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """Tenant A names an argument "maximum context length is 0": the overflow read from the
    refusal states a window of nothing, which no model has. Kept, it made A's next request
    fail to be prepared (a division by zero) and go unchanged, its compaction off; now
    nothing is learned, and that request goes as any other."""
    argument = "maximum context length is 0"
    proxy = await proxy_told_a_limit(make_proxy, fake, aiohttp_server, argument)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="small-model",
            messages=history(),  # type: ignore[arg-type]
        )
    # Above its threshold, inside its window: compacted in the background, as any request.
    assert raw.headers["x-compaction-status"] == "precompacting"


async def test_a_client_with_more_requests_than_the_pool_leaves_others_a_connection(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """A pool of four upstream connections, a client's share three. Client A sends four
    requests the upstream takes two seconds to answer; B's, sent while they are in flight,
    is answered at once (it waited behind A's before the share), and all four of A's are
    answered, its fourth after one of its own."""

    @web.middleware
    async def slow_for_a(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("Authorization") == "Bearer sk-a":
            await asyncio.sleep(2.0)
        return await handler(request)

    app = fake.app()
    app.middlewares.append(slow_for_a)
    server: TestServer = await aiohttp_server(app)
    upstream = str(server.make_url("/v1"))
    proxy = await make_proxy(routes=[route(upstream, "small-*", WINDOW)], upstream_pool_size=4)
    waits_before = counter("compaction_proxy_upstream_share_waits_total")

    async def hello(key: str) -> float:
        started = time.perf_counter()
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key=key, max_retries=0) as client:
            await client.chat.completions.create(
                model="small-model",
                messages=[user(f"hello {uuid.uuid4().hex[:6]}")],  # type: ignore[list-item]
            )
        return time.perf_counter() - started

    a_requests = [asyncio.create_task(hello("sk-a")) for _ in range(4)]
    await asyncio.sleep(0.5)  # three of A's upstream, the fourth waiting for one of them
    assert await hello("sk-b") < 1.0
    a_latencies = sorted(await asyncio.gather(*a_requests))
    assert a_latencies[2] < 3.0 < a_latencies[3]
    assert counter("compaction_proxy_upstream_share_waits_total") == waits_before + 1
