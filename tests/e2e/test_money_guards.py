"""Money guards, counted at the fake upstream: whatever the clients do, summary calls stay
within the configured ceilings."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory
from tests.helpers import MASKING_OFF, counter, route
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

MODEL = "small-model"
WINDOW = 16_000


def routes(upstream_url: str) -> list[dict[str, Any]]:
    return [route(upstream_url, "small-*", WINDOW, **MASKING_OFF)]


def history(opening: str) -> list[dict[str, Any]]:
    """About 14k tokens: above the 12.8k threshold, inside the 16k window."""
    return [
        system(),
        user(opening),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
    ]


def trips(guard: str) -> float:
    return counter("compaction_proxy_guard_trips_total", guard=guard)


async def send(
    url: str, key: str, messages: list[dict[str, Any]], model: str = MODEL, **headers: str
) -> str:
    async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0) as client:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                extra_headers=headers,
            )
        except openai.BadRequestError:
            return "error"
    return raw.headers["x-compaction-status"]


async def test_a_client_rewriting_its_first_message_is_bounded_by_its_tenants_ceiling(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """No session id: each rewritten opening is a new conversation with nothing to reuse."""
    proxy = await make_proxy(routes=routes(upstream_url), summaries_per_minute_per_tenant=3)
    before = trips("tenant_ceiling")
    for turn in range(10):
        await send(proxy.url, "sk-rewriter", history(f"[{turn}] Make the importer idempotent."))
    assert len(fake.summary_requests) == 3
    assert trips("tenant_ceiling") == before + 7


async def test_rotating_api_keys_are_bounded_by_the_routes_ceiling(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Each new key is a new tenant with a fresh tenant ceiling; the route's holds."""
    proxy = await make_proxy(
        routes=routes(upstream_url),
        summaries_per_minute_per_tenant=60,
        summaries_per_minute_per_route=4,
    )
    before = trips("route_ceiling")
    messages = history("Make the importer idempotent.")
    for _ in range(12):
        await send(proxy.url, f"sk-rotated-{uuid.uuid4().hex}", messages)
    assert len(fake.summary_requests) == 4
    assert trips("route_ceiling") == before + 8


async def test_a_fixed_session_rewriting_a_message_pays_one_recovery_per_cooldown(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    # A 13k window: the ~14k history overflows whenever it goes uncompacted, so overflow
    # recovery is exercised once the miss guard stops proactive compaction.
    fake.windows["tight-model"] = 13_000
    route = {
        "model": "tight-model",
        "base_url": upstream_url,
        "context_window": 13_000,
        "policy": MASKING_OFF,
    }
    proxy = await make_proxy(routes=[route], checkpoint_miss_limit=3)
    before = trips("recovery_cooldown")
    base = history("Make the importer idempotent.")
    statuses = []
    for turn in range(10):
        rewritten = [base[0], user(f"[now: 12:00:{turn:02}] {base[1]['content']}"), *base[2:]]
        statuses.append(
            await send(
                proxy.url, "sk-a", rewritten, "tight-model", **{"X-Session-Id": "fixed-session"}
            )
        )
    # Three proactive summaries before the miss guard stops them, then one recovery (its
    # rounds) for the cooldown; every later overflow is passed on as the upstream said it.
    # Every request is a first contact (its opening changed): the first three go at once with
    # older observations cut, each preparing a checkpoint the next one misses.
    assert statuses[:3] == ["pruned"] * 3
    assert len(fake.summary_requests) <= 3 + 2, statuses
    assert trips("recovery_cooldown") >= before + 5


async def test_the_tenant_ceiling_is_shared_by_replicas_on_one_redis(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    replicas = [
        await make_proxy(
            routes=routes(upstream_url),
            store_url=private_redis.url,
            summaries_per_minute_per_tenant=2,
        )
        for _ in range(2)
    ]
    for turn in range(6):
        proxy = replicas[turn % 2]
        await send(proxy.url, "sk-two-replicas", history(f"[{turn}] Make it idempotent."))
    assert len(fake.summary_requests) == 2
