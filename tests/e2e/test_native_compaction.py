"""The providers' own compaction APIs through the openai SDK, against an upstream that has none
(the fake's Responses endpoint knows no ``compaction_trigger``; its compact endpoint is only
reached when the route relays): ``/v1/responses/compact`` and a ``compaction_trigger`` are
answered from the proxy's engine with one compaction item the proxy made, and that item,
sent back on any route, becomes the checkpoint; another tenant's, or an altered one, is
refused and nothing reaches the upstream."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from compaction_proxy.formats.sealed_checkpoints import TOKEN_PREFIX
from compaction_proxy.security.client_keys import digest_of
from compaction_proxy.testing.fake_answers import is_summary_request
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory
from tests.helpers import counter, route

pytest.importorskip("openai")

import openai

MODEL = "compact-model"
FACT = "FACT-1: the importer listens on port 8431"


def native_route(base_url: str, model: str = "compact-*", **fields: Any) -> dict[str, Any]:
    return {**route(base_url, model, 16_000), **fields}


def history(turns: int = 12) -> list[dict[str, Any]]:
    """A Responses agent history: a task naming a fact, then tool rounds (about 3k tokens)."""
    items: list[dict[str, Any]] = [{"role": "user", "content": f"{FACT}. Fix the importer."}]
    for index in range(turns):
        call = f"call_{index}"
        arguments = f'{{"command": "cat part_{index}.log"}}'
        items.append(
            {"type": "function_call", "call_id": call, "name": "shell", "arguments": arguments}
        )
        output = " ".join(f"line{index}-{n}" for n in range(80))
        items.append({"type": "function_call_output", "call_id": call, "output": output})
    return items


def client(proxy_url: str, key: str = "sk-alice") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy_url, api_key=key, max_retries=0)


async def test_compact_is_served_by_the_proxy_and_its_item_becomes_the_checkpoint(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """``responses.compact``: the input's user messages, then one compaction item the proxy
    made (the upstream's compact endpoint never reached); sent back, the item reaches the
    upstream as the checkpoint's message, the fact kept."""
    proxy = await make_proxy(routes=[native_route(upstream_url)])
    async with client(proxy.url) as alice:
        compacted = await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
        assert compacted.object == "response.compaction"
        item = compacted.output[-1]
        assert item.type == "compaction" and item.encrypted_content.startswith(TOKEN_PREFIX)
        assert [o.type for o in compacted.output[:-1]] == ["message"]
        assert fake.endpoints.requests == []  # served here
        assert len(fake.summary_requests) >= 1
        # The SDK types compact's output as a response's: its user messages (input_text
        # parts, as the API returns them) are read as assistant ones, and dumping them back
        # warns of the mismatch. Sent back as they came, as Codex does.
        back = [o.model_dump(exclude_none=True, warnings=False) for o in compacted.output]
        answer = await alice.responses.create(
            model=MODEL,
            input=[*back, {"role": "user", "content": "Go on."}],  # type: ignore[arg-type]
        )
    assert answer.output_text
    sent = fake.responses.forwarded[-1]
    text = str(sent["input"])
    assert FACT in text and "<compacted-summary>" in text and TOKEN_PREFIX not in text


async def test_an_item_made_on_one_route_is_the_checkpoint_on_another_upstream(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """The compacted history moves with the user: made on a route to one upstream, accepted
    on a route to another."""
    other = FakeUpstream()
    other_url = str((await aiohttp_server(other.app())).make_url("/v1"))
    routes = [native_route(upstream_url), native_route(other_url, "elsewhere-*")]
    proxy = await make_proxy(routes=routes)
    async with client(proxy.url) as alice:
        compacted = await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
        item = compacted.output[-1].model_dump(exclude_none=True)
        await alice.responses.create(
            model="elsewhere-model",
            input=[item, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
        )
    assert FACT in str(other.responses.forwarded[-1]["input"])


async def test_another_tenants_or_an_altered_item_is_refused_and_nothing_goes_upstream(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=[native_route(upstream_url)])
    async with client(proxy.url) as alice:
        compacted = await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
    item = compacted.output[-1].model_dump(exclude_none=True)
    content = item["encrypted_content"]
    altered = {**item, "encrypted_content": content[:-2] + ("AA" if content[-2:] != "AA" else "BB")}
    forwarded = len(fake.responses.received)
    cases = [("sk-bob", item), ("sk-alice", altered)]
    for key, sent in cases:
        async with client(proxy.url, key) as caller:
            with pytest.raises(openai.BadRequestError) as refused:
                await caller.responses.create(
                    model=MODEL,
                    input=[sent, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
                )
        body = refused.value.body
        assert isinstance(body, dict) and body["code"] == "invalid_encrypted_content"
        assert body["param"] == "input[0].encrypted_content"
    assert len(fake.responses.received) == forwarded


async def test_a_compaction_trigger_is_answered_with_exactly_one_compaction_item_streamed(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Codex's remote compaction: a streamed Responses request ending with a
    ``compaction_trigger`` gets one ``compaction`` output item, which the upstream (that
    knows no trigger) never sees."""
    proxy = await make_proxy(routes=[native_route(upstream_url)])
    served = counter("compaction_proxy_requests_total", route="compact-*", outcome="compacted")
    async with client(proxy.url) as alice:
        stream = await alice.responses.create(
            model=MODEL,
            input=[*history(), {"type": "compaction_trigger"}],  # type: ignore[list-item]
            stream=True,
        )
        events = [event async for event in stream]
    assert [e.type for e in events][-1] == "response.completed"
    done = [e for e in events if e.type == "response.output_item.done"]
    assert len(done) == 1 and done[0].item.type == "compaction"
    completed = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in completed.output] == ["compaction"]
    assert all("compaction_trigger" not in str(b) for b in fake.responses.forwarded)
    assert counter("compaction_proxy_requests_total", route="compact-*", outcome="compacted") == (
        served + 1
    )


async def test_a_short_history_is_compacted_too(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Below the size a checkpoint pays for on its own, an asked-for compaction is still made
    (a client's ``/compact`` at any length)."""
    proxy = await make_proxy(routes=[native_route(upstream_url)])
    async with client(proxy.url) as alice:
        compacted = await alice.responses.compact(
            model=MODEL, input=[{"role": "user", "content": f"{FACT}. Hello."}]
        )
    assert compacted.output[-1].type == "compaction"


async def test_a_compaction_past_the_tenants_summary_ceiling_is_a_rate_limit_not_an_outage(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The summary calls a minute at their ceiling: 429 with ``Retry-After`` in OpenAI's
    shape (the SDK's ``RateLimitError``, which it retries after waiting), as the admin API
    answers; the other tenants are not held back."""
    proxy = await make_proxy(routes=[native_route(upstream_url)], summaries_per_minute_per_tenant=1)
    async with client(proxy.url) as alice, client(proxy.url, "sk-bob") as bob:
        await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
        another = [{"role": "user", "content": "Fix the exporter."}, *history()[1:]]
        with pytest.raises(openai.RateLimitError) as refused:
            await alice.responses.compact(model=MODEL, input=another)  # type: ignore[arg-type]
        compacted = await bob.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
    assert refused.value.response.headers["retry-after"] == "60"
    assert refused.value.code == "rate_limit_exceeded"
    assert compacted.output[-1].type == "compaction"
    assert len(fake.summary_requests) == 2


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def failing_summaries(
    fake: FakeUpstream,
    aiohttp_server: Any,
    keys: set[str],
    answer: Callable[[], web.Response],
    failed: list[str],
) -> str:
    """The fake provider answering the summary calls made on ``keys`` with ``answer()`` (each
    call's key appended to ``failed``); the base URL of it."""

    @web.middleware
    async def summary_rule(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = orjson.loads(await request.read()) if request.can_read_body else None
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if isinstance(body, dict) and is_summary_request(body) and key in keys:
            failed.append(key)
            return answer()
        return await handler(request)

    app = fake.app()
    app.middlewares.append(summary_rule)
    server: TestServer = await aiohttp_server(app)
    return str(server.make_url("/v1"))


def provider_error(status: int, kind: str, code: str | None, **headers: str) -> web.Response:
    body = {"error": {"message": f"{kind} (the summary call)", "type": kind, "code": code}}
    return web.json_response(body, status=status, headers=headers)


async def test_a_compaction_whose_summary_calls_are_rate_limited_is_a_429_until_they_may_go(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """The upstream rate-limits the caller's summary calls (429, ``Retry-After: 30``): the
    compaction is refused as a rate limit with the upstream's wait, and so is the next one
    while that wait lasts, without another call; another tenant compacts meanwhile."""
    limited = partial(
        provider_error, 429, "requests", "rate_limit_exceeded", **{"Retry-After": "30"}
    )
    failed: list[str] = []
    upstream = await failing_summaries(fake, aiohttp_server, {"sk-alice"}, limited, failed)
    proxy = await make_proxy(routes=[native_route(upstream)])
    async with client(proxy.url) as alice, client(proxy.url, "sk-bob") as bob:
        with pytest.raises(openai.RateLimitError) as first:
            await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError) as again:
            await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
        compacted = await bob.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
    assert first.value.response.headers["retry-after"] == "30"
    assert 1 <= int(again.value.response.headers["retry-after"]) <= 30
    assert first.value.code == again.value.code == "rate_limit_exceeded"
    assert compacted.output[-1].type == "compaction"
    assert failed == ["sk-alice"] and len(fake.summary_requests) == 1  # and bob's


async def test_a_spent_quota_is_a_429_saying_so_without_a_wait_of_the_proxys_own_making(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """A 429 stating no wait (OpenAI's ``insufficient_quota``): a rate limit, without a
    ``Retry-After`` of the breaker's own making, so an SDK retries briefly and gives up at
    once, as it would on the upstream's own answer; and of the upstream's kind, which clients
    (Codex among them) read as a spent quota to stop on, not a rate limit to retry."""
    spent = partial(provider_error, 429, "insufficient_quota", "insufficient_quota")
    upstream = await failing_summaries(fake, aiohttp_server, {"sk-alice"}, spent, [])
    proxy = await make_proxy(routes=[native_route(upstream)])
    async with client(proxy.url) as alice:
        for _ in range(2):  # the first call's answer, then the breaker's back-off
            with pytest.raises(openai.RateLimitError) as refused:
                await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
            assert "retry-after" not in refused.value.response.headers
            assert "rate-limiting" in refused.value.message
            assert refused.value.code == refused.value.type == "insufficient_quota"


async def test_a_spent_quota_of_the_routes_own_key_is_not_told_as_the_callers(
    make_proxy: ProxyFactory,
    fake: FakeUpstream,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The summary calls go out on a key the route holds, and that key's quota is spent: a
    rate limit, but not the caller's spent quota, which the caller's own key is not."""
    monkeypatch.setenv("ROUTE_KEY", "sk-route")
    spent = partial(provider_error, 429, "insufficient_quota", "insufficient_quota")
    upstream = await failing_summaries(fake, aiohttp_server, {"sk-route"}, spent, [])
    proxy = await make_proxy(
        routes=[native_route(upstream, api_key_env="ROUTE_KEY")],
        client_key_digests=[digest_of("cpk-alice-0123456789")],
    )
    async with client(proxy.url, "cpk-alice-0123456789") as alice:
        with pytest.raises(openai.RateLimitError) as refused:
            await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
    assert refused.value.code == "rate_limit_exceeded" and refused.value.type == "requests"


async def test_a_compaction_while_the_summarizer_is_down_is_a_503_at_once(
    make_proxy: ProxyFactory, fake: FakeUpstream, aiohttp_server: Any
) -> None:
    """The summary call fails as an outage (a 500): 503 ``compaction_unavailable`` with no
    wait to sit out; the client's own fallback takes over as soon as its SDK gives up."""
    down = partial(provider_error, 500, "server_error", None)
    upstream = await failing_summaries(fake, aiohttp_server, {"sk-alice"}, down, [])
    proxy = await make_proxy(routes=[native_route(upstream)])
    async with client(proxy.url) as alice:
        with pytest.raises(openai.InternalServerError) as refused:
            await alice.responses.compact(model=MODEL, input=history())  # type: ignore[arg-type]
    assert refused.value.status_code == 503 and refused.value.code == "compaction_unavailable"
    assert "retry-after" not in refused.value.response.headers


async def test_relay_sends_compact_to_an_upstream_that_has_it(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """``native_compaction: relay`` (what ``auto`` does for OpenAI's own API): the upstream's
    compact endpoint answers, the proxy makes nothing."""
    proxy = await make_proxy(routes=[native_route(upstream_url, native_compaction="relay")])
    async with client(proxy.url) as alice:
        compacted = await alice.responses.compact(model=MODEL, input="Hello.")
    assert [r.path for r in fake.endpoints.requests] == ["/v1/responses/compact"]
    assert compacted.output[-1].type == "message" and fake.summary_requests == []


def over_threshold(turns: int = 12) -> list[dict[str, Any]]:
    return [*history(turns), {"role": "user", "content": "What did part 3 say?"}]


COMPACTION_OPTION = [{"type": "compaction", "compact_threshold": 1_000}]


async def test_context_management_compaction_puts_the_item_first_and_sends_the_checkpoint(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """``context_management`` compaction over its threshold, whole and streamed: the upstream
    (which has no such option, and never sees it) gets the checkpoint and the live turn; the
    answer lists the compaction item first, the model's answer after it, so a client that
    keeps what follows the item loses nothing. Sent back, the item is the checkpoint."""
    proxy = await make_proxy(routes=[native_route(upstream_url)])
    async with client(proxy.url) as alice:
        whole = await alice.responses.create(
            model=MODEL,
            input=over_threshold(),  # type: ignore[arg-type]
            context_management=COMPACTION_OPTION,  # type: ignore[arg-type]
        )
        assert [o.type for o in whole.output] == ["compaction", "message"]
        sent = fake.responses.forwarded[-1]
        assert "context_management" not in sent
        # The checkpoint, then the live turn: the last call, its result, the question.
        assert "<compacted-summary>" in str(sent["input"][0])
        assert sent["input"][1:] == over_threshold()[-3:]
        async with alice.responses.stream(
            model=MODEL,
            input=over_threshold(13),  # type: ignore[arg-type]
            context_management=COMPACTION_OPTION,  # type: ignore[arg-type]
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        assert [o.type for o in final.output] == ["compaction", "message"]
        added = [e for e in events if e.type == "response.output_item.added"]
        assert [(e.output_index, e.item.type) for e in added] == [(0, "compaction"), (1, "message")]
        assert final.output_text
        item = whole.output[0].model_dump(exclude_none=True)
        await alice.responses.create(
            model=MODEL,
            input=[item, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
        )
    assert FACT in str(fake.responses.forwarded[-1]["input"])


async def test_context_management_under_its_threshold_changes_nothing_but_the_option(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=[native_route(upstream_url)])
    option = [{"type": "compaction", "compact_threshold": 100_000}]
    async with client(proxy.url) as alice:
        answer = await alice.responses.create(
            model=MODEL,
            input=over_threshold(),  # type: ignore[arg-type]
            context_management=option,  # type: ignore[arg-type]
        )
    assert [o.type for o in answer.output] == ["message"]
    sent = fake.responses.forwarded[-1]
    assert "context_management" not in sent and len(sent["input"]) == len(over_threshold())


async def test_context_management_is_relayed_as_sent_where_the_route_relays(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=[native_route(upstream_url, native_compaction="relay")])
    async with client(proxy.url) as alice:
        await alice.responses.create(
            model=MODEL,
            input=over_threshold(),  # type: ignore[arg-type]
            context_management=COMPACTION_OPTION,  # type: ignore[arg-type]
        )
    assert fake.responses.forwarded[-1]["context_management"] == COMPACTION_OPTION
