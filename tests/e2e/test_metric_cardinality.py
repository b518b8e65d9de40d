"""No client can add series to the metrics, and a scrape never holds other clients."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from compaction_proxy.http import metrics_endpoint
from compaction_proxy.http.passthrough import KNOWN_TEMPLATES, METHODS
from tests.conftest import RunningProxy


def series(text: str, name: str) -> set[str]:
    return {line.split(" ")[0] for line in text.splitlines() if line.startswith(name + "{")}


async def scrape(http: aiohttp.ClientSession, proxy: RunningProxy) -> str:
    async with http.get(f"{proxy.root}/metrics") as response:
        return await response.text()


async def test_deep_paths_odd_methods_and_unknown_models_add_no_series(
    proxy: RunningProxy,
) -> None:
    name = "compaction_proxy_passthrough_requests_total"
    async with aiohttp.ClientSession() as http:
        for n in range(300):
            path = f"/v1/files/f{n}/" + "/".join(f"d{n}x{i}" for i in range(n % 9)) + "/" * (n % 2)
            method = ("GET", "PURGE", f"M{n}")[n % 3]
            async with http.request(method, f"{proxy.root}{path}") as response:
                await response.read()
        async with http.get(f"{proxy.url}/files/{'x' * 8192}/y/z") as response:
            await response.read()
        for n in range(50):  # unknown models all go to the default route: one label value
            body = {"model": f"model-{n}", "messages": [{"role": "user", "content": "x"}]}
            async with http.post(f"{proxy.url}/chat/completions", json=body) as response:
                await response.read()
        text = await scrape(http, proxy)
    labels = [
        dict(p.split("=") for p in s[len(name) + 1 : -1].split(",")) for s in series(text, name)
    ]
    assert {label["path"].strip('"') for label in labels} <= KNOWN_TEMPLATES | {"other"}
    assert {label["method"].strip('"') for label in labels} <= METHODS | {"other"}
    routes = {s for s in series(text, "compaction_proxy_requests_total")}
    assert not [s for s in routes if "model-" in s]
    assert max(len(line) for line in text.splitlines()) < 1000


async def test_a_slow_scrape_never_holds_another_clients_request(
    proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow_exposition(registry: Any) -> bytes:
        time.sleep(0.6)  # a registry of many series, or many workers' files
        return b""

    monkeypatch.setattr(metrics_endpoint, "generate_latest", slow_exposition)
    async with aiohttp.ClientSession() as http:
        # The proxy serves on this test's own event loop: a scrape built on it would hold this
        # sleep, and the health check after it, until the exposition was done.
        started = time.perf_counter()
        scraping = asyncio.create_task(scrape(http, proxy))
        await asyncio.sleep(0.1)
        async with http.get(f"{proxy.root}/healthz") as response:
            assert response.status == 200
        waited = time.perf_counter() - started
        await scraping
    assert waited < 0.45, waited
