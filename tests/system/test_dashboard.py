"""The Grafana dashboard, checked against a real Prometheus scraping a real proxy process.

A workload that compacts, prunes, waits for leases and recovers from an overflow runs through
a proxy process; Prometheus scrapes it every second; then every panel's query is evaluated
through Prometheus's HTTP API and must return data.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, assistant, system, tool, user
from tests.processes import proxy_process
from tests.prometheus_server import (
    CHART,
    GROUPING,
    SCRAPE_SECONDS,
    SELECTOR,
    Prometheus,
    exported_labels,
)

pytest.importorskip("openai")

import openai

DASHBOARD = CHART / "dashboards"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads((DASHBOARD / "compaction-proxy.json").read_bytes())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]]


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["route"]["query"]["query"].startswith("label_values(")
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for topic in (
        "outcome",
        "overhead",
        "pressure",
        "compactions",
        "saved",
        "overflow",
        "summary",
        "store",
        "background",
    ):
        assert topic in titles


def test_route_filter_applies_wherever_a_series_has_a_route() -> None:
    """A panel's series carrying a route label are filtered by ``$route``; a panel with none
    says it shows every route; every query names metrics and labels the proxy exports."""
    exported = exported_labels()
    for panel in dashboard()["panels"]:
        routed = False
        for target in panel["targets"]:
            expr = target["expr"]
            for name, matchers in SELECTOR.findall(expr):
                assert name in exported, (panel["title"], name)
                if "route" in exported[name]:
                    routed = True
                    assert 'route=~"$route"' in matchers, (panel["title"], expr)
                else:
                    assert "$route" not in matchers, (panel["title"], expr)
            for grouping in GROUPING.findall(expr):
                names = {label.strip() for label in grouping.split(",")}
                used = {n for n, _ in SELECTOR.findall(expr)}
                assert all(names <= exported[n] for n in used), (panel["title"], expr)
        assert routed != panel["title"].endswith("(all routes)"), panel["title"]


def test_guard_bypass_disconnect_and_threshold_series_are_charted() -> None:
    charted = " ".join(t["expr"] for _, t in panel_targets())
    for series in (
        "compaction_proxy_bypassed_requests_total",
        "compaction_proxy_guard_trips_total",
        "compaction_proxy_client_disconnects_total",
        "compaction_proxy_over_threshold_requests_total",
    ):
        assert series in charted


def panel_targets() -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in dashboard()["panels"] for t in p["targets"]]


async def workload(base: str) -> None:
    """Prunes, compacts under pressure, waits for a lease, recovers from an overflow."""
    tag = uuid.uuid4().hex[:6]
    big_tool = " ".join(f"trace{i % 61}" for i in range(6_000))
    pressure = [
        system(),
        user(f"FACT-1: {tag}"),
        *agent_turns(30, output="log line " * 160),
        assistant(None, ("t", "bash", "{}")),
        tool("t", big_tool),
        user("next?"),
    ]
    overflowing = [
        system(),
        user(f"overflow {tag}"),
        *agent_turns(40, output="scheduler trace entry " * 150),
        user("go on"),
    ]
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
        await asyncio.gather(
            *(
                client.chat.completions.create(model="dash-small", messages=pressure)  # type: ignore[arg-type]
                for _ in range(3)
            )
        )
        await client.chat.completions.create(model="dash-tight", messages=overflowing)  # type: ignore[arg-type]
        stream = await client.chat.completions.create(
            model="dash-small",
            messages=[*pressure, assistant("ok"), user("more")],  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        async for _ in stream:
            pass


async def test_every_panel_query_returns_data(
    prometheus: Prometheus, fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows["dash-tight"] = 16_000
    fake.summary_delay = 0.2
    routes = orjson.dumps(
        [
            {"model": "dash-small", "base_url": upstream_url, "context_window": 16_000},
            {"model": "dash-tight", "base_url": upstream_url, "context_window": 128_000},
        ]
    ).decode()
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "dash",
        "COMPACTION_PROXY_ROUTES": routes,
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
    }
    async with proxy_process(env) as (_, base):
        await prometheus.start(base.removeprefix("http://"))
        await asyncio.sleep(3 * SCRAPE_SECONDS)
        await workload(base)
        await asyncio.sleep(3 * SCRAPE_SECONDS)
        await workload(base)
        await asyncio.sleep(4 * SCRAPE_SECONDS)

        empty: list[str] = []
        for title, expr in panel_queries():
            concrete = expr.replace("$__rate_interval", "1m").replace("$route", ".*")
            if not (await prometheus.api("query", query=concrete))["result"]:
                empty.append(f"{title}: {concrete}")
    assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
