"""Paths the proxy relays as sent, side by side in one run: a bare relay, this checkout's proxy,
and (``--against DIR``) another checkout's, in front of the fake upstream.

Three kinds of request, each sent one at a time: an embeddings request (a small JSON body,
routed by its ``model``), a model lookup (a GET), and a 256 KiB multipart upload (streamed to
the upstream without being buffered). Rounds are interleaved, the targets' order rotated
round by round, so that noise on a shared host hits them alike. Printed per kind: req/s and
the CPU time each target's process spent per request (Linux schedstat), and both as ratios to
the relay. Run: ``python -m tests.bench.passthrough [--against DIR] [--rounds N]
[--requests N]``. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import orjson

from tests.bench.overhead import (
    at_rest,
    cpu_jiffies,
    metered_env,
    process,
    rotated,
    run_ns,
    stolen_since,
)
from tests.processes import free_port, proxy_process, wait_until_ready

UPLOAD = b"x" * (256 * 1024)
EMBEDDINGS = orjson.dumps({"model": "text-embedding-3-small", "input": ["a line of text"] * 40})


async def one(http: aiohttp.ClientSession, base: str, kind: str) -> None:
    headers = {"Authorization": "Bearer bench"}
    if kind == "embeddings":
        call = http.post(
            f"{base}/v1/embeddings",
            data=EMBEDDINGS,
            headers={**headers, "Content-Type": "application/json"},
        )
    elif kind == "model":
        call = http.get(f"{base}/v1/models/gpt-4o-mini", headers=headers)
    else:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", UPLOAD, filename="rows.jsonl")
        call = http.post(f"{base}/v1/files", data=form, headers=headers)
    async with call as response:
        await response.read()
        assert response.status == 200, (kind, response.status)


@asynccontextmanager
async def targets(against: str | None) -> AsyncIterator[tuple[dict[str, str], dict[str, int]]]:
    """Every target's base URL and the process whose CPU time is its own."""
    port, relay_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{port}"
    async with AsyncExitStack() as stack:
        fake = ["-m", "compaction_proxy.testing.fake_upstream", "--port", str(port), "--instant"]
        await stack.enter_async_context(process(*fake))
        relay_args = ["-m", "tests.bench.relay", "--port", str(relay_port)]
        relay = await stack.enter_async_context(
            process(*relay_args, "--upstream", f"{upstream}/v1")
        )
        bases, pids = {"relay": f"http://127.0.0.1:{relay_port}"}, {"relay": relay.pid}
        env = {**metered_env(upstream), "COMPACTION_PROXY_STORE_URL": "memory://"}
        proxy, bases["proxy"] = await stack.enter_async_context(proxy_process(env))
        pids["proxy"] = proxy.pid
        if against is not None:
            other, bases["proxy@"] = await stack.enter_async_context(
                proxy_process(env, cwd=against)
            )
            pids["proxy@"] = other.pid
        for base in bases.values():
            await wait_until_ready(f"{base}/v1/models")
        await at_rest(list(pids.values()))  # litellm imported, nothing else running
        yield bases, pids


async def run(against: str | None, rounds: int, requests: int) -> None:
    kinds = ("embeddings", "model", "upload")
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    cpu_ns: dict[tuple[str, str], int] = defaultdict(int)
    async with targets(against) as (bases, pids), aiohttp.ClientSession() as http:
        for base in bases.values():  # warm each target's pools and code paths
            for kind in kinds:
                await one(http, base, kind)
        stolen = cpu_jiffies()
        for turn in range(rounds):
            for name, base in rotated(bases, turn):
                for kind in kinds:
                    cpu, started = run_ns([pids[name]]), time.perf_counter()
                    for _ in range(requests):
                        await one(http, base, kind)
                    seconds[name, kind] += time.perf_counter() - started
                    cpu_ns[name, kind] += run_ns([pids[name]]) - cpu
        print(f"{rounds} rounds of {requests} requests of each kind, one at a time")
        for kind in kinds:
            print(f"\n{kind}")
            print(f"{'target':10} {'req/s':>8} {'/ relay':>8} {'CPU ms/req':>11} {'/ relay':>8}")
            sent = rounds * requests
            relay_rate = sent / seconds["relay", kind]
            relay_cpu = cpu_ns["relay", kind] / sent / 1e6
            for name in bases:
                rate, cpu_ms = sent / seconds[name, kind], cpu_ns[name, kind] / sent / 1e6
                print(
                    f"{name:10} {rate:8.1f} {rate / relay_rate:7.2f}x "
                    f"{cpu_ms:11.3f} {cpu_ms / relay_cpu:7.2f}x"
                )
        print(f"\n{stolen_since(stolen)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="another checkout (a worktree of the parent commit)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200, help="of each kind, per round")
    args = parser.parse_args(argv)
    asyncio.run(run(args.against, args.rounds, args.requests))


if __name__ == "__main__":
    main()
