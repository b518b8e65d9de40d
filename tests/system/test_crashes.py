"""Faults that used to lock a conversation or make every request wait: a proxy killed in the
middle of a summary, and a summarizer that stopped answering."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

import orjson
import pytest

from compaction_proxy.config.settings import Settings
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory
from tests.helpers import MASKING_OFF
from tests.processes import proxy_process
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

MODEL = "crash-model"
WINDOW = 16_000


def heavy(turns: int = 35) -> list[dict[str, Any]]:
    return [system(), user("Port the scheduler."), *agent_turns(turns, output="trace " * 400)]


async def ask(base_url: str, messages: list[dict[str, Any]], **headers: str) -> Any:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-crash", max_retries=0) as client:
        return await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            extra_headers=headers,
        )


def test_the_default_lease_blocks_a_conversation_for_seconds_not_minutes() -> None:
    assert Settings().lease_ttl_seconds <= 15


async def test_a_proxy_killed_mid_summary_blocks_the_next_request_only_briefly(
    fake: FakeUpstream, upstream_url: str, private_redis: RedisServer
) -> None:
    lease_ttl = 3.0
    fake.windows[MODEL] = WINDOW
    fake.summary_delay = 60.0  # the first proxy dies long before its summary returns
    routes = [
        {
            "model": MODEL,
            "base_url": upstream_url,
            "context_window": WINDOW,
            "policy": MASKING_OFF,
        }
    ]
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "REDIS_URL": private_redis.url,
        "COMPACTION_PROXY_TENANT_SECRET": "crash-secret",
        "COMPACTION_PROXY_ROUTES": orjson.dumps(routes).decode(),
        "COMPACTION_PROXY_LEASE_TTL_SECONDS": str(lease_ttl),
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
    }
    session = {"X-Session-Id": "killed-mid-summary"}
    history = heavy()
    async with proxy_process(env) as (first, base):
        doomed = asyncio.create_task(ask(f"{base}/v1", history, **session))
        while not fake.summary_requests:
            await asyncio.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        await first.wait()
        # It went at once (first contact: model-free relief) or died with its proxy; either
        # way the dead proxy's background round left its lease behind.
        with contextlib.suppress(openai.APIConnectionError):
            await doomed

    fake.summary_delay = 0.0
    async with proxy_process(env) as (_, base):
        started = time.monotonic()
        reply = await ask(f"{base}/v1", [*history, *agent_turns(1)], **session)
        waited = time.monotonic() - started
        assert reply.headers["x-compaction-status"] != "bypass"
        assert waited < lease_ttl + 3.0, f"blocked {waited:.1f} s by a dead proxy's lease"
        # The conversation is not locked: once the dead lease has expired, it is summarized
        # again (on the request, or behind it).
        await asyncio.sleep(lease_ttl)
        longer = [*history, *agent_turns(2)]
        deadline = time.monotonic() + 15
        while len(fake.summary_requests) < 2 and time.monotonic() < deadline:
            reply = await ask(f"{base}/v1", longer, **session)
            await asyncio.sleep(0.5)
    assert len(fake.summary_requests) >= 2, "the dead proxy's lease kept the conversation locked"


async def test_a_dead_summarizer_costs_one_wait_per_cooldown(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows[MODEL] = WINDOW
    fake.summary_delay = 30.0  # never answers in time
    proxy = await make_proxy(
        summary_timeout_seconds=1.0,
        routes=[
            {
                "model": MODEL,
                "base_url": upstream_url,
                "context_window": WINDOW,
                "policy": MASKING_OFF,
            }
        ],
    )
    waits = []
    for run in range(6):  # six conversations under pressure
        started = time.monotonic()
        reply = await ask(proxy.url, [*heavy(), user(f"conversation {run}")])
        waits.append(time.monotonic() - started)
        assert reply.parse().choices[0].message.content == "ok"
    # Only the first conversation's round called the summarizer, in the background: no
    # request waited for it (each went at once with model-free relief).
    assert len(fake.summary_requests) == 1
    assert max(waits) < 1.0, waits

    # The overflow path respects the breaker too: the upstream's error, and no wait.
    fake.windows[MODEL] = 8_000
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError):
        await ask(proxy.url, [*heavy(), user("one more")])
    assert time.monotonic() - started < 1.0
    assert len(fake.summary_requests) == 1
