"""Does one client's huge request stall the others? Side by side in one run.

Run: ``python -m tests.bench.event_loop``. Not collected by pytest. A real proxy process sits in
front of the fake upstream (instant answers). A second client sends small one-message requests
back to back, first alone (the baseline), then while a first client sends a 20,000-message
request and then a 30 MB one. Printed: the small client's p50 / p99 / max in both phases and
their ratio, and how long the big requests themselves took.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import aiohttp
import orjson

from tests.bench.overhead import process
from tests.processes import free_port, proxy_process, wait_until_ready

MODEL = "bench-model"


def many_messages(count: int) -> bytes:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"message {i} of a very long chat"})
    messages.append({"role": "user", "content": "and now?"})
    return orjson.dumps({"model": MODEL, "messages": messages})


def huge_body(megabytes: int) -> bytes:
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    text = words * (megabytes * 1024 * 1024 // len(words))
    return orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]})


async def post(http: aiohttp.ClientSession, base: str, body: bytes) -> float:
    started = time.perf_counter()
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer bench",
        "X-Session-Id": uuid.uuid4().hex,
    }
    async with http.post(f"{base}/v1/chat/completions", data=body, headers=headers) as response:
        await response.read()
        assert response.status == 200, (response.status, await response.text())
    return time.perf_counter() - started


async def small_requests(
    http: aiohttp.ClientSession, base: str, stop: asyncio.Event, at_least: int
) -> list[float]:
    latencies: list[float] = []
    while not stop.is_set() or len(latencies) < at_least:
        body = orjson.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
        )
        latencies.append(await post(http, base, body))
    return latencies


def summary(latencies: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000, ordered[-1] * 1000


async def main(baseline_requests: int, messages: int, megabytes: int) -> None:
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    routes = [{"model": MODEL, "base_url": upstream, "context_window": 128_000}]
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream,
        "COMPACTION_PROXY_ROUTES": orjson.dumps(routes).decode(),
        "COMPACTION_PROXY_TENANT_SECRET": "bench",
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
        "COMPACTION_PROXY_MAX_BODY_BYTES": str(64 * 1024 * 1024),
    }
    # The instant fake estimates tokens from bytes, so it gets a window it never enforces; the
    # proxy compacts against the route's 128k.
    fake = ("-m", "proxy.testing.fake_upstream", "--port", str(upstream_port), "--instant")
    fake += ("--window", "100000000")
    big_bodies = [("20,000 messages", many_messages(messages)), ("30 MB", huge_body(megabytes))]
    async with process(*fake), proxy_process(env) as (_, base):
        await wait_until_ready(f"{upstream}/models")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            stop = asyncio.Event()
            stop.set()
            await small_requests(http, base, stop, 50)  # warm up
            alone = await small_requests(http, base, stop, baseline_requests)

            stop = asyncio.Event()
            beside = asyncio.create_task(small_requests(http, base, stop, baseline_requests))
            big_durations = []
            for label, body in big_bodies:
                big_durations.append((label, len(body), await post(http, base, body)))
            stop.set()
            during = await beside

    p50a, p99a, maxa = summary(alone)
    p50b, p99b, maxb = summary(during)
    for label, n, (p50, p99, most) in (
        ("alone", len(alone), (p50a, p99a, maxa)),
        ("beside big ones", len(during), (p50b, p99b, maxb)),
    ):
        print(
            f"small requests {label:<16} n={n:>5}  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms"
            f"  max {most:8.2f} ms"
        )
    print(f"ratio beside/alone:               p50 x{p50b / p50a:.2f}  p99 x{p99b / p99a:.2f}")
    for label, size, seconds in big_durations:
        print(f"big request {label:<16} {size / 1024:>9,.0f} KiB  took {seconds:6.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-requests", type=int, default=300)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--megabytes", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.baseline_requests, args.messages, args.megabytes))
