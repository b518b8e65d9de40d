"""Proxy overhead, side by side: direct to the upstream, through a bare relay, through the proxy.

Run: ``python -m tests.bench.overhead [--rounds N] [--transcript NAME]``. Not collected by
pytest. The fake upstream answers instantly (no token counting), so what differs between the
three columns is the hop in the middle. Modes are interleaved round by round so that noise on a
shared machine hits all three alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson

from tests.processes import free_port, proxy_process, wait_until_ready
from tests.transcripts import replay_requests, transcripts


@asynccontextmanager
async def process(*args: str) -> AsyncIterator[None]:
    proc = await asyncio.create_subprocess_exec(sys.executable, *args)
    try:
        yield
    finally:
        proc.terminate()
        await proc.wait()


async def replay(
    http: aiohttp.ClientSession, base: str, bodies: list[bytes], concurrency: int
) -> tuple[list[float], float]:
    """Send every body (``concurrency`` replays at once); latencies and wall time."""
    latencies: list[float] = []

    async def one_replay() -> None:
        for body in bodies:
            started = time.perf_counter()
            async with http.post(
                f"{base}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json", "Authorization": "Bearer bench"},
            ) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one_replay() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def run(rounds: int, transcript: str | None, concurrency: int, store_url: str) -> None:
    every = transcripts()
    chosen = next((t for t in every if transcript and transcript in t.name), every[0])
    messages = chosen.messages
    bodies = [
        orjson.dumps({"model": "bench-model", "messages": history})
        for history in replay_requests(messages)
    ]
    upstream_port, relay_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    async with (
        process("-m", "proxy.testing.fake_upstream", "--port", str(upstream_port), "--instant"),
        process(
            "-m", "tests.bench.relay", "--port", str(relay_port), "--upstream", f"{upstream}/v1"
        ),
        proxy_process(
            {
                "COMPACTION_PROXY_UPSTREAM_BASE_URL": f"{upstream}/v1",
                "COMPACTION_PROXY_TENANT_SECRET": "bench",
                "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
                "COMPACTION_PROXY_STORE_URL": store_url,
            }
        ) as (_, proxy_base),
    ):
        relay = f"http://127.0.0.1:{relay_port}"
        for ready in (f"{upstream}/v1/models", f"{relay}/v1/models", f"{proxy_base}/healthz"):
            await wait_until_ready(ready)
        modes = {"direct": upstream, "relay": relay, "proxy": proxy_base}
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as http:
            for base in modes.values():
                await replay(http, base, bodies, 1)
            results: dict[str, dict[str, list[float]]] = {
                m: {"latency": [], "rps": []} for m in modes
            }
            for _ in range(rounds):
                for mode, base in modes.items():
                    latencies, wall = await replay(http, base, bodies, concurrency)
                    results[mode]["latency"].extend(latencies)
                    results[mode]["rps"].append(len(latencies) / wall)

    size = statistics.mean(len(b) for b in bodies)
    print(
        f"transcript {chosen.name}: {len(bodies)} requests per replay, mean body "
        f"{size / 1024:.0f} KiB, {rounds} rounds, concurrency {concurrency}, store {store_url}"
    )
    print(f"{'mode':<8}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    summary: dict[str, tuple[float, float, float]] = {}
    for mode, data in results.items():
        rps = statistics.median(data["rps"])
        p50 = percentile(data["latency"], 0.50) * 1000
        p99 = percentile(data["latency"], 0.99) * 1000
        summary[mode] = (rps, p50, p99)
        print(f"{mode:<8}{rps:>10.1f}{p50:>10.2f}{p99:>10.2f}")
    for other in ("relay", "direct"):
        rps, p50, p99 = (summary["proxy"][i] / summary[other][i] for i in range(3))
        print(f"proxy/{other:<7} req/s x{rps:.2f}  p50 x{p50:.2f}  p99 x{p99:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transcript", help="part of a transcript file name")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--store", default="memory://", help="the proxy's store_url")
    args = parser.parse_args(argv)
    asyncio.run(run(args.rounds, args.transcript, args.concurrency, args.store))


if __name__ == "__main__":
    main()
