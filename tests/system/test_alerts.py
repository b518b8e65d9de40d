"""The alerting rules evaluated by a real Prometheus scraping a real proxy process: every rule
evaluates without error on the series the proxy really exports, none is pending or firing under
ordinary traffic, and a summarizer failing for two tenants, or a store that stops answering,
makes its alert pending (their ``for`` is minutes: pending is where a true expression shows)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, assistant, system, tool, user
from tests.processes import proxy_process
from tests.prometheus_server import ALERT_RULES, SCRAPE_SECONDS, Prometheus, alert_names
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

WINDOW = 16_000


def over_the_window() -> list[dict[str, Any]]:
    """An agent's history past a 16k window, whose oldest turns a summary would replace."""
    return [
        system(),
        user(f"FACT-1: {uuid.uuid4().hex[:6]}"),
        *agent_turns(30, output="log line " * 160),
        assistant(None, ("t", "bash", "{}")),
        tool("t", " ".join(f"trace{i % 61}" for i in range(6_000))),
        user("next?"),
    ]


async def ask(base: str, key: str, messages: list[dict[str, Any]]) -> None:
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0) as client:
        await client.chat.completions.create(model="alert-model", messages=messages)  # type: ignore[arg-type]


async def alerts(prometheus: Prometheus) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await prometheus.api("alerts"))["alerts"]
    return found


async def pending(prometheus: Prometheus, name: str, timeout: float = 20) -> dict[str, Any]:
    """Alert ``name`` once Prometheus holds it pending (fails if it never does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for alert in await alerts(prometheus):
            if alert["labels"]["alertname"] == name:
                assert alert["state"] == "pending", alert
                return alert
        await asyncio.sleep(SCRAPE_SECONDS / 2)
    raise AssertionError(f"{name} never became pending")


def proxy_env(upstream_url: str) -> dict[str, str]:
    """A proxy process whose one route has a 16k window."""
    routes = [{"model": "alert-model", "base_url": upstream_url, "context_window": WINDOW}]
    return {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "alerts",
        "COMPACTION_PROXY_ROUTES": orjson.dumps(routes).decode(),
        "COMPACTION_PROXY_LOG_LEVEL": "ERROR",
    }


async def alerting_rules(prometheus: Prometheus) -> list[dict[str, Any]]:
    groups = (await prometheus.api("rules", type="alert"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


async def test_the_rules_hold_quiet_on_ordinary_traffic_and_see_a_summarizer_fail(
    prometheus: Prometheus, fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows["alert-model"] = WINDOW
    env = proxy_env(upstream_url)
    async with proxy_process(env) as (_, base):
        await prometheus.start(base.removeprefix("http://"), rules=ALERT_RULES)
        # Ordinary traffic: short conversations of two clients, and one compacted as it passes
        # its window with the summarizer up.
        for turn in range(12):
            for key in ("sk-a", "sk-b"):
                await ask(base, key, [system(), user(f"question {turn} of {key}")])
        await ask(base, "sk-a", over_the_window())
        await asyncio.sleep(3 * SCRAPE_SECONDS)  # scraped and evaluated since, twice or more
        evaluated = await alerting_rules(prometheus)
        assert sorted(rule["name"] for rule in evaluated) == sorted(alert_names())
        for rule in evaluated:
            assert rule["health"] == "ok" and not rule.get("lastError"), rule
            assert not rule["lastEvaluation"].startswith("0001-"), rule  # evaluated
        assert await alerts(prometheus) == []

        # The summarizer fails for two tenants: its breaker opens for everyone.
        fake.summary_failures = 1_000
        await ask(base, "sk-a", over_the_window())
        await ask(base, "sk-b", over_the_window())
        down = await pending(prometheus, "CompactionProxySummarizerDown")
    assert down["labels"]["summarizer"] == "alert-model"
    assert down["labels"]["severity"] == "warning"


async def test_a_store_that_stops_answering_makes_its_alert_pending(
    prometheus: Prometheus, fake: FakeUpstream, upstream_url: str, private_redis: RedisServer
) -> None:
    """Redis goes away under a running proxy: the process serves on from its own copy, and
    the store's alert becomes pending on that process's series."""
    env = {**proxy_env(upstream_url), "REDIS_URL": private_redis.url}
    async with proxy_process(env) as (_, base):
        await prometheus.start(base.removeprefix("http://"), rules=ALERT_RULES)
        await ask(base, "sk-a", [system(), user("before the outage")])
        await asyncio.sleep(3 * SCRAPE_SECONDS)
        assert await alerts(prometheus) == []
        await private_redis.stop()
        await ask(base, "sk-a", [system(), user("during the outage")])  # answered all the same
        unavailable = await pending(prometheus, "CompactionProxyStoreUnavailable")
    assert unavailable["labels"]["instance"] == base.removeprefix("http://")
