"""The proxy as a process: the console entry point, and graceful shutdown."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import openai

from proxy.testing.fake_upstream import FakeUpstream
from tests.builders import user
from tests.processes import proxy_process


async def test_sigterm_drains_in_flight_requests(fake: FakeUpstream, upstream_url: str) -> None:
    fake.response_delay = 1.0
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
    }
    async with proxy_process(env) as (process, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
            in_flight = asyncio.create_task(
                client.chat.completions.create(model="fake-model", messages=[user("hello")])
            )
            while not fake.received:
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            reply = await in_flight
            assert reply.choices[0].message.content == "ok"
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_metrics_on_their_own_port(upstream_url: str) -> None:
    import aiohttp

    from tests.processes import free_port

    port = free_port()
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "COMPACTION_PROXY_METRICS_PORT": str(port),
    }
    async with proxy_process(env) as (_, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
            await client.chat.completions.create(model="fake-model", messages=[user("hi")])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
    assert 'compaction_proxy_requests_total{outcome="ok",route="*"} 1.0' in text


async def test_metrics_combine_worker_processes(upstream_url: str, tmp_path: Any) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, any worker's /metrics reports all workers together."""
    import aiohttp

    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    async with proxy_process(env) as (_, first), proxy_process(env) as (_, second):
        for base in (first, second, second):
            async with openai.AsyncOpenAI(
                base_url=f"{base}/v1", api_key="k", max_retries=0
            ) as client:
                await client.chat.completions.create(model="fake-model", messages=[user("hi")])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{first}/metrics") as response:
                text = await response.text()
    assert 'compaction_proxy_requests_total{outcome="ok",route="*"} 3.0' in text
