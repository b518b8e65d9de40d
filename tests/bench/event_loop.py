"""Does one client's huge request stall the others? Side by side in one run.

Run: ``python -m tests.bench.event_loop [--store-url redis://...]``. Not collected by pytest.
Three targets in turn: the upstream directly, a bare aiohttp relay, and a real proxy process.
Against each, a second client sends small one-message requests back to back, first alone (the
baseline), then while a first client sends a 20,000-message request, a 30 MB one, and a 30 MB
embeddings request (relayed as sent: the proxy reads its ``model`` to route it). Big
and small requests go to two fake upstream processes (instant answers), as a provider's many
servers would take them, so the fake's own parsing of 30 MB is not what is measured. Printed
per target: the small client's p50 / p99 / max in both phases and their ratio, how long each
big request took, and the slowest small request in flight meanwhile (a stall it caused).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import aiohttp
import orjson

from tests.bench.overhead import at_rest, process
from tests.processes import free_port, proxy_process, wait_until_ready

MODEL = "bench-model"
BIG_MODEL = "bench-big"
# The relay parses nothing, so it picks the big requests' upstream by this header.
BIG_LANE = {"X-Bench-Upstream": "big"}


def many_messages(count: int) -> bytes:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"message {i} of a very long chat"})
    messages.append({"role": "user", "content": "and now?"})
    return orjson.dumps({"model": BIG_MODEL, "messages": messages})


def huge_body(megabytes: int) -> bytes:
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    text = words * (megabytes * 1024 * 1024 // len(words))
    return orjson.dumps({"model": BIG_MODEL, "messages": [{"role": "user", "content": text}]})


def huge_embeddings_request(megabytes: int) -> bytes:
    """An embeddings request (relayed as sent; the proxy reads only its ``model``)."""
    line = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 20
    count = megabytes * 1024 * 1024 // len(line)
    return orjson.dumps({"model": BIG_MODEL, "input": [line] * count})


async def post(
    http: aiohttp.ClientSession,
    base: str,
    body: bytes,
    extra: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
) -> float:
    started = time.perf_counter()
    headers = extra or {}
    headers |= {
        "Content-Type": "application/json",
        "Authorization": "Bearer bench",
        "X-Session-Id": uuid.uuid4().hex,
    }
    async with http.post(f"{base}{path}", data=body, headers=headers) as response:
        await response.read()
        assert response.status == 200, (response.status, await response.text())
    return time.perf_counter() - started


async def small_requests(
    http: aiohttp.ClientSession,
    base: str,
    stop: asyncio.Event,
    at_least: int,
    ended: list[float] | None = None,
) -> list[float]:
    """Latencies of small requests sent one after another until ``stop``; the time each
    ended is appended to ``ended``."""
    latencies: list[float] = []
    while not stop.is_set() or len(latencies) < at_least:
        body = orjson.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
        )
        latencies.append(await post(http, base, body))
        if ended is not None:
            ended.append(time.perf_counter())
    return latencies


def summary(latencies: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000, ordered[-1] * 1000


async def measure(
    http: aiohttp.ClientSession,
    small_base: str,
    big_base: str,
    baseline_requests: int,
    big_bodies: list[tuple[str, str, bytes]],
) -> tuple[list[float], list[float], list[tuple[str, int, float, float]]]:
    """The small client alone, then while the big requests are in flight (only those small
    requests count); and how long each big one took."""
    stop = asyncio.Event()
    stop.set()
    await small_requests(http, small_base, stop, 50)  # warm up
    alone = await small_requests(http, small_base, stop, baseline_requests)
    stop = asyncio.Event()
    ended: list[float] = []
    beside = asyncio.create_task(small_requests(http, small_base, stop, 0, ended))
    spans = []
    for label, path, body in big_bodies:
        started = time.perf_counter()
        took = await post(http, big_base, body, dict(BIG_LANE), path)
        spans.append((label, len(body), started, took))
    stop.set()
    during = await beside
    big_durations = []
    for label, size, started, took in spans:
        # The slowest small request that was in flight while this big one was.
        overlapping = [
            latency
            for latency, end in zip(during, ended, strict=True)
            if end > started and end - latency < started + took
        ]
        big_durations.append((label, size, took, max(overlapping, default=0.0)))
    return alone, during, big_durations


async def main(baseline_requests: int, messages: int, megabytes: int, store_url: str) -> None:
    """Big and small requests go to two upstream processes, as a provider's would: what is
    measured is the proxy's own stall, not the fake upstream's parsing of 30 MB."""
    small_port, big_port, relay_port = free_port(), free_port(), free_port()
    small_upstream = f"http://127.0.0.1:{small_port}/v1"
    big_upstream = f"http://127.0.0.1:{big_port}/v1"
    routes = [
        {"model": MODEL, "base_url": small_upstream, "context_window": 128_000},
        {"model": BIG_MODEL, "base_url": big_upstream, "context_window": 128_000},
    ]
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": small_upstream,
        "COMPACTION_PROXY_ROUTES": orjson.dumps(routes).decode(),
        "COMPACTION_PROXY_TENANT_SECRET": "bench",
        "COMPACTION_PROXY_LOG_LEVEL": "ERROR",
        "COMPACTION_PROXY_MAX_BODY_BYTES": str(64 * 1024 * 1024),
        "COMPACTION_PROXY_STORE_URL": store_url,
    }

    def fake(port: int) -> tuple[str, ...]:
        # The instant fake estimates tokens from bytes, so it gets a window it never enforces;
        # the proxy compacts against the route's 128k.
        instant = ("--instant", "--window", "100000000")
        return ("-m", "compaction_proxy.testing.fake_upstream", "--port", str(port), *instant)

    relay: tuple[str, ...] = ("-m", "tests.bench.relay", "--port", str(relay_port))
    relay += ("--upstream", small_upstream)
    relay += ("--big-upstream", big_upstream)
    chat = "/v1/chat/completions"
    big_bodies = [
        ("20,000 messages", chat, many_messages(messages)),
        (f"{megabytes} MB", chat, huge_body(megabytes)),
        (f"{megabytes} MB embeddings", "/v1/embeddings", huge_embeddings_request(megabytes)),
    ]
    async with (
        process(*fake(small_port)),
        process(*fake(big_port)),
        process(*relay),
        proxy_process(env) as (proxy, proxy_base),
    ):
        relay_base = f"http://127.0.0.1:{relay_port}"
        targets = {
            "direct": (small_upstream.removesuffix("/v1"), big_upstream.removesuffix("/v1")),
            "relay": (relay_base, relay_base),
            "proxy": (proxy_base, proxy_base),
        }
        for base, _ in targets.values():
            await wait_until_ready(f"{base}/v1/models")
        await wait_until_ready(f"{big_upstream}/models")
        await at_rest([proxy.pid])  # litellm loaded, so the baseline is the proxy at rest
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            results = {
                name: await measure(http, small, big, baseline_requests, big_bodies)
                for name, (small, big) in targets.items()
            }

    print(f"store {store_url}")
    for name, (alone, during, big_durations) in results.items():
        p50a, p99a, maxa = summary(alone)
        p50b, p99b, maxb = summary(during)
        print(f"{name}:")
        for label, n, (p50, p99, most) in (
            ("alone", len(alone), (p50a, p99a, maxa)),
            ("beside big ones", len(during), (p50b, p99b, maxb)),
        ):
            print(
                f"  small requests {label:<16} n={n:>5}  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms"
                f"  max {most:8.2f} ms"
            )
        print(f"  ratio beside/alone:               p50 x{p50b / p50a:.2f}  p99 x{p99b / p99a:.2f}")
        for label, size, seconds, worst in big_durations:
            print(
                f"  big request {label:<20} {size / 1024:>9,.0f} KiB  took {seconds:6.2f} s"
                f"  slowest small request meanwhile {worst * 1000:8.2f} ms"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-requests", type=int, default=300)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--megabytes", type=int, default=30)
    parser.add_argument("--store-url", default="memory://", help="e.g. redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    asyncio.run(main(args.baseline_requests, args.messages, args.megabytes, args.store_url))
