"""Fail-open when Redis is gone, recovery when it returns, and survival of a proxy restart."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from prometheus_client import REGISTRY

from compaction_proxy.conversation.messages import chain_hashes, chain_root, split_head
from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.security.tenant import tenant_of
from compaction_proxy.store import BeginResult
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.redis_server import RedisServer, shared_redis_url

pytest.importorskip("openai")

import openai

BEGUN = BeginResult.BEGUN
START = {"type": "compaction/start"}
MODEL = "fake-model"


def store_errors() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "compaction_proxy_store_errors":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


async def ask(proxy: RunningProxy, messages: list[dict[str, Any]]) -> tuple[str, str | None]:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        assert raw.parse().choices[0].message.content == "ok"
        return raw.headers["x-compaction-status"], raw.headers.get("x-compaction-conversation")


async def ready(proxy: RunningProxy) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.root}/readyz") as response,
    ):
        return response.status


async def back(proxy: RunningProxy) -> None:
    """Wait until the proxy uses its store again: ready once its probe found Redis back
    (``store.circuit``: within about 2 s)."""
    deadline = asyncio.get_running_loop().time() + 10
    while await ready(proxy) != 200:
        assert asyncio.get_running_loop().time() < deadline, "the store was not used again"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("fallback", [False, True])
async def test_stopped_redis_is_served_around_then_used_again_without_restart(
    make_proxy: ProxyFactory, private_redis: RedisServer, fake: FakeUpstream, fallback: bool
) -> None:
    """With the fallback off, a request that fits goes as it came (``bypass``); with it on
    (the default), the conversation goes on in the process's own copy (``none`` here)."""
    proxy = await make_proxy(store_url=private_redis.url, store_fallback=fallback)
    history = [system(), user("keep going"), *agent_turns(2)]
    assert (await ask(proxy, history))[0] == "none"
    assert await ready(proxy) == 200

    await private_redis.stop()
    errors_before = store_errors()
    status, conversation = await ask(proxy, [*history, user("while redis is down")])
    assert (status, conversation is None) == (("none", False) if fallback else ("bypass", True))
    assert fake.chat_requests[-1].body["messages"] == [*history, user("while redis is down")]
    assert await ready(proxy) == 503
    assert store_errors() > errors_before

    await private_redis.start()
    await back(proxy)
    status, conversation = await ask(proxy, [*history, user("redis is back")])
    assert status == "none"
    assert conversation is not None


async def test_wrong_store_url_still_answers_every_request(make_proxy: ProxyFactory) -> None:
    from tests.processes import free_port

    proxy = await make_proxy(store_url=f"redis://127.0.0.1:{free_port()}/0")
    assert (await ask(proxy, [user("hello")]))[0] == "none"  # the process's own copy
    assert await ready(proxy) == 503
    alone = await make_proxy(store_url=f"redis://127.0.0.1:{free_port()}/0", store_fallback=False)
    assert (await ask(alone, [user("hello")]))[0] == "bypass"


async def test_generated_tenant_secret_waits_for_the_store(
    make_proxy: ProxyFactory, private_redis: RedisServer
) -> None:
    await private_redis.stop()
    proxy = await make_proxy(store_url=private_redis.url, tenant_secret=None)
    assert (await ask(proxy, [user("hello")]))[0] == "bypass"
    await private_redis.start()
    await back(proxy)
    assert (await ask(proxy, [user("hello")]))[0] == "none"


async def test_records_and_log_survive_a_proxy_restart(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    # A fresh conversation on the shared Redis: unique opening, so unique chain and id.
    history = [system(), user(f"a long task {uuid.uuid4()}"), *agent_turns(3)]
    first = await make_proxy(store_url=shared_redis_url(), tenant_secret=None)
    _, conversation = await ask(first, history)
    assert conversation is not None

    # A compaction committed by the first instance (the engine comes later; the record is real).
    root = chain_root(tenant_of(await first.app[SERVICES].tenant_secret.get(), "k"))
    chain = chain_hashes(root, split_head(history)[1])
    summary = user("<compacted-summary>the story so far</compacted-summary>")
    record = Checkpoint(0, 4, root, chain[4], summary, tokens=9)  # ends at a tool result
    assert await first.store.begin_compaction(conversation, "o", 30, START) is BEGUN
    assert await first.store.commit_compaction(conversation, "o", [], [record])
    await first.server.close()

    second = await make_proxy(store_url=shared_redis_url(), tenant_secret=None)
    later = [*history, user("continue")]
    status, again = await ask(second, later)
    assert (status, again) == ("compacted", conversation)  # it carries the first's checkpoint
    assert fake.chat_requests[-1].body["messages"] == [system(), summary, *later[6:]]

    store = RedisStore(shared_redis_url())
    events = [e for _, e in (await store.read_log(conversation, limit=1000)).events]
    await store.close()
    assert [e["type"] for e in events].count("request") == 2
    assert [e["position"] for e in events if e["type"] == "message"] == list(range(len(later) - 1))


async def test_redis_lost_mid_replay_then_compaction_resumes(
    make_proxy: ProxyFactory, private_redis: RedisServer, fake: FakeUpstream, upstream_url: str
) -> None:
    from tests.transcripts import replay_requests, transcript_named

    fake.windows["resilient-model"] = 16_000
    proxy = await make_proxy(
        store_url=private_redis.url,
        tenant_secret=None,
        routes=[{"model": "resilient-model", "base_url": upstream_url, "context_window": 16_000}],
    )
    messages = transcript_named("django-11283").messages
    statuses: list[str] = []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as client:
        for turn, history in enumerate(replay_requests(messages)):
            if turn == 5:
                await private_redis.stop()
            if turn == 15:
                await private_redis.start()
                await back(proxy)
            raw = await client.chat.completions.with_raw_response.create(
                model="resilient-model",
                messages=history,  # type: ignore[arg-type]
            )
            assert raw.parse().choices[0].message.content == "ok"
            statuses.append(raw.headers["x-compaction-status"])
    assert set(statuses[:5]) == {"none"}
    # The process's own copy carried the conversation while Redis was away.
    assert "bypass" not in statuses[5:15]
    assert "bypass" not in statuses[15:]
    # Compaction resumed on the restarted Redis: masks, or a summary (in the background or on
    # the request), whichever relieved the conversation.
    assert {"compacted", "precompacting", "masked"} & set(statuses[15:])
    assert all(r.prompt_tokens <= 16_000 for r in fake.chat_requests)
    # The restarted Redis holds the whole body again, though this process remembered a tip.
    from compaction_proxy.conversation.log_view import latest_request

    conversation = raw.headers["x-compaction-conversation"]
    store = RedisStore(private_redis.url)
    events = [e for _, e in (await store.read_log(conversation, limit=100_000)).events]
    await store.close()
    positions = sorted(e["position"] for e in events if e["type"] == "message")
    assert positions == list(range(len(history) - 1))  # the body: all but the system prompt
    logged = latest_request(events)
    assert logged is not None and logged.body == history[1:]


async def test_replicas_agree_on_the_generated_tenant_secret_after_redis_loses_its_data(
    make_proxy: ProxyFactory, private_redis: RedisServer
) -> None:
    """Two replicas on one Redis without a configured secret, Redis flushed twice mid-run:
    the same client keeps one conversation id across replicas after each loss."""
    messages = [system(), user(f"tenant secret {uuid.uuid4().hex}")]

    async def replica() -> RunningProxy:
        proxy = await make_proxy(store_url=private_redis.url, tenant_secret=None)
        proxy.app[SERVICES].tenant_secret.refresh_seconds = 0  # look at the store on every request
        return proxy

    async def flush() -> None:
        client = redis.asyncio.from_url(private_redis.url)
        await client.flushall()
        await client.aclose()

    a = await replica()
    _, first = await ask(a, messages)
    await flush()
    _, again = await ask(a, messages)
    assert again == first  # the running replica wrote its secret back
    b = await replica()
    assert (await ask(b, messages))[1] == first

    await flush()
    c = await replica()  # started after the loss: it writes a fresh secret first
    _, from_c = await ask(c, messages)
    assert (await ask(a, messages))[1] == from_c
    assert (await ask(b, messages))[1] == from_c
