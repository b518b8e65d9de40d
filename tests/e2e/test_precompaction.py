"""Compaction ahead of need: the request that reaches the threshold does not wait for a summary
call, because the checkpoint was prepared in the background from an earlier request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
from prometheus_client import REGISTRY

from proxy.compaction.summarize import framed_summary_text
from proxy.keys import BACKGROUND
from proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.redis_server import RedisServer

MODEL = "agent-model"
WINDOW = 16_000
SUMMARY_SECONDS = 1.0
THINK_SECONDS = 0.6  # an agent's time between requests (the model answering, tools running)


def route(upstream_url: str, **policy: Any) -> list[dict[str, Any]]:
    return [{"model": MODEL, "base_url": upstream_url, "context_window": WINDOW, "policy": policy}]


def lease_waits() -> float:
    return sum(
        REGISTRY.get_sample_value("compaction_proxy_lease_waits_total", {"result": result}) or 0
        for result in ("released", "timed_out")
    )


async def grow(proxy: RunningProxy, turns: int) -> tuple[list[str], list[float]]:
    """A conversation growing by one tool round (about 450 tokens) per request."""
    statuses, latencies = [], []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        for turn in range(1, turns + 1):
            messages = [
                system(),
                user("Make the importer idempotent."),
                *agent_turns(turn, output="importer log line " * 150),
            ]
            started = time.perf_counter()
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
            )
            latencies.append(time.perf_counter() - started)
            statuses.append(raw.headers["x-compaction-status"])
            await asyncio.sleep(THINK_SECONDS)
    return statuses, latencies


async def test_the_threshold_request_finds_its_checkpoint_ready(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_delay = SUMMARY_SECONDS
    proxy = await make_proxy(routes=route(upstream_url))
    waits_before = lease_waits()
    statuses, latencies = await grow(proxy, 32)
    await proxy.app[BACKGROUND].idle()
    assert "precompacting" in statuses and fake.summary_requests
    # No request waited on a summary call: none compacted synchronously, none waited on the
    # lease of a background round (and, loosely, none took as long as one summary call).
    assert "compacted" not in statuses and lease_waits() == waits_before
    assert max(latencies) < SUMMARY_SECONDS, latencies
    # Every request after the first that carried the checkpoint still carries one, and none
    # was forwarded at or above the threshold.
    carried = [
        any(framed_summary_text(m) is not None for m in (r.body or {}).get("messages", []))
        for r in fake.chat_requests
    ]
    assert all(carried[carried.index(True) :])
    assert all(r.prompt_tokens < 0.8 * WINDOW for r in fake.chat_requests)


async def test_without_precompaction_the_threshold_request_waits(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The same conversation with precompaction off: the baseline the first test beats."""
    fake.summary_delay = SUMMARY_SECONDS
    proxy = await make_proxy(routes=route(upstream_url, precompact_ratio=0))
    statuses, latencies = await grow(proxy, 32)
    assert "compacted" in statuses and "precompacting" not in statuses
    assert max(latencies) >= SUMMARY_SECONDS


async def test_a_background_round_cut_short_by_shutdown_frees_its_lease(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_delay = 30  # still summarizing when the proxy stops
    proxy = await make_proxy(routes=route(upstream_url))
    log_lines = "importer log line " * 150
    messages = [system(), user("Make it idempotent."), *agent_turns(26, output=log_lines)]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "precompacting"
    conversation = raw.headers["x-compaction-conversation"]
    await asyncio.sleep(0.2)
    assert proxy.app[BACKGROUND].in_flight == 1
    assert (await proxy.store.load(conversation)).lease_owner is not None
    await proxy.app[BACKGROUND].close()  # what the app's cleanup does on SIGTERM
    state = await proxy.store.load(conversation)
    assert state.lease_owner is None
    log = [e for _, e in (await proxy.store.read_log(conversation, limit=1000)).events]
    assert log[-1]["type"] == "compaction/end" and log[-1]["outcome"] != "committed"


async def test_two_replicas_prepare_one_checkpoint_per_span(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    fake.summary_delay = 1.0
    replicas = [
        await make_proxy(routes=route(upstream_url), store_url=private_redis.url) for _ in range(2)
    ]
    log_lines = "importer log line " * 150
    messages = [system(), user("Make it idempotent."), *agent_turns(26, output=log_lines)]

    async def send(proxy: RunningProxy) -> str:
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as c:
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
            )
        return raw.headers["x-compaction-status"]

    statuses = await asyncio.gather(*(send(proxy) for proxy in replicas))
    assert "precompacting" in statuses
    for proxy in replicas:
        await proxy.app[BACKGROUND].idle()
    assert len(fake.summary_requests) == 1
