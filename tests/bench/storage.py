"""What Redis holds per conversation, side by side: logs packed into segments, and as plain JSON.

Run: ``python -m tests.bench.storage [--window 16000] [--gap 0.05]``. Not collected by pytest.
Every transcript is replayed, as its agent sent it, through a proxy process on a private
redis-server of its own (one per set-up, so nothing else is counted), with a route whose window
is ``--window``. Then every key of each conversation is weighed with ``MEMORY USAGE`` (what
Redis really allocates for it, overheads included) and summed per conversation. Printed per
set-up: the log packs the proxy made (``compaction_proxy_log_packs_total``: from events it held,
or read back), the mean, median and largest conversation in KB, and the mean of each key kind
(a conversation's segments and seen Sets each summed as one kind); then the unique message
content the conversations hold (each distinct message's JSON once), the floor a store of plain
JSON cannot go under.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from collections import defaultdict
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.precompaction import serve
from tests.processes import proxy_process
from tests.redis_server import RedisServer
from tests.transcripts import BASH_TOOL, Transcript, replay_requests, transcripts

MODEL = "bench-model"
PACKS = "compaction_proxy_log_packs_total"
SETUPS = {"plain JSON": "false", "packed": "true"}


async def replay(
    http: aiohttp.ClientSession, base: str, transcript: Transcript, gap: float
) -> None:
    messages = transcript.messages
    extra = {"tools": BASH_TOOL} if any(m.get("tool_calls") for m in messages) else {}
    headers = {"Authorization": f"Bearer sk-{uuid.uuid4().hex}"}
    for history in replay_requests(messages):
        body = orjson.dumps({"model": MODEL, "messages": history, **extra})
        async with http.post(
            f"{base}/v1/chat/completions",
            data=body,
            headers={**headers, "Content-Type": "application/json"},
        ) as reply:
            assert reply.status == 200, (reply.status, await reply.text())
        await asyncio.sleep(gap)


async def weigh(url: str) -> dict[str, dict[str, int]]:
    """Bytes Redis holds per conversation, by key kind (``log``, ``state``...)."""
    client = aioredis.Redis.from_url(url)
    held: dict[str, dict[str, int]] = defaultdict(dict)
    try:
        async for key in client.scan_iter(match="cp:{*}:*", count=1000):
            name = key.decode()
            conversation, _, kind = name.removeprefix("cp:{").rpartition("}:")
            if conversation == "quota":  # the summary ceilings' keys: no conversation's
                continue
            kind = kind.split(":")[0]  # each segment's key, each seen Set: one kind
            held[conversation][kind] = held[conversation].get(kind, 0)
            held[conversation][kind] += int(await client.memory_usage(name, samples=0) or 0)
    finally:
        await client.aclose()
    return held


async def measure(
    every: list[Transcript], window: int, gap: float, compress: str
) -> dict[str, dict[str, int]]:
    fake = FakeUpstream()
    redis = RedisServer()
    await redis.start()
    try:
        async with serve(fake) as upstream:
            route = {"model": MODEL, "base_url": upstream, "context_window": window}
            env = {
                "COMPACTION_PROXY_ROUTES": orjson.dumps([route]).decode(),
                "COMPACTION_PROXY_TENANT_SECRET": "bench-storage",
                "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
                "COMPACTION_PROXY_STORE_URL": redis.url,
                "COMPACTION_PROXY_LOG_COMPRESSION": compress,
            }
            async with (
                proxy_process(env) as (_, base),
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http,
            ):
                await asyncio.gather(*(replay(http, base, t, gap) for t in every))
                await asyncio.sleep(1.0)  # the last records, written after the answers
                async with http.get(f"{base}/metrics") as scraped:
                    metrics = await scraped.text()
                packs = [line for line in metrics.splitlines() if line.startswith(PACKS)]
                print(
                    f"log packs, packing {compress}: " + ", ".join(p[len(PACKS) :] for p in packs)
                )
        return await weigh(redis.url)
    finally:
        await redis.stop()


def unique_content(every: list[Transcript]) -> list[int]:
    """Per conversation, the bytes of its distinct messages' JSON."""
    sizes = []
    for transcript in every:
        seen = {orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in transcript.messages}
        sizes.append(sum(len(m) for m in seen))
    return sizes


def report(name: str, held: dict[str, dict[str, int]]) -> None:
    totals = [sum(kinds.values()) for kinds in held.values()]
    print(
        f"{name:>12}: {len(totals)} conversations, mean {statistics.mean(totals) / 1024:.0f} KB,"
        f" median {statistics.median(totals) / 1024:.0f} KB, largest {max(totals) / 1024:.0f} KB"
    )
    by_kind: dict[str, int] = defaultdict(int)
    for kinds in held.values():
        for kind, size in kinds.items():
            by_kind[kind] += size
    shares = sorted(by_kind.items(), key=lambda item: -item[1])
    each = [f"{kind} {size / len(totals) / 1024:.0f} KB" for kind, size in shares]
    print(" " * 14 + "mean by key: " + ", ".join(each))


async def run(args: argparse.Namespace) -> None:
    every = transcripts()
    if args.transcripts:
        every = every[: args.transcripts]
    results: dict[str, Any] = {}
    for name, compress in SETUPS.items():
        results[name] = await measure(every, args.window, args.gap, compress)
    print(f"Redis bytes per conversation, {len(every)} transcripts at a {args.window}-token window")
    for name, held in results.items():
        report(name, held)
    unique = unique_content(every)
    print(f"{'unique JSON':>12}: mean {statistics.mean(unique) / 1024:.0f} KB per conversation")
    plain, packed = (statistics.mean(sum(k.values()) for k in results[n].values()) for n in SETUPS)
    print(f"packed / plain: x{packed / plain:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", type=int, default=16_000)
    parser.add_argument("--gap", type=float, default=0.05)
    parser.add_argument("--transcripts", type=int, default=0, help="only the first N")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
