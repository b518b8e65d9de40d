"""Conversations that begin alike (twins), measured side by side with fresh ones in one run.

Run: ``python -m tests.bench.twins [--twins 1000] [--samples 300] [--summary-seconds 3]``.
Not collected by pytest. Without a session id a conversation is named by its first message, so
every conversation that opens with "hi" has one name. One proxy process on a private Redis, in
front of a fake upstream:

* **reads**: the store is seeded with ``--twins`` conversations that open with "hi", each with a
  checkpoint of about 1.4 KiB committed on its own branch (as each would be once compacted;
  seeded through the store the proxy uses, since a thousand compactions through the proxy
  would take minutes and measure nothing more). Then, in turn, a new twin (opens with "hi")
  and a fresh conversation (an opener of its own), ``--samples`` of each, both short enough
  that nothing compacts. Printed: each one's p50 and p90 latency and the ratio new twin /
  fresh.
* **leases**: five twins over the threshold sent at once, each needing a summary that takes
  ``--summary-seconds``; then five fresh conversations the same way. Printed: each request's
  latency and the slowest of each five.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import aiohttp
import orjson

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.conversation.messages import branch_fingerprint
from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.security.tenant import tenant_of
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.overhead import percentile
from tests.bench.precompaction import serve
from tests.builders import agent_turns, system, user
from tests.helpers import route
from tests.processes import proxy_process
from tests.redis_server import RedisServer

MODEL = "small-model"
WINDOW = 16_000
SECRET = "bench-twins"
KEY = "sk-bench"
SUMMARY_TEXT = "The user said hi; the assistant greeted them and asked about the task. " * 20


def opened_with(opener: str, name: str) -> list[dict[str, Any]]:
    """A short conversation: ``opener``, a greeting, and a question of its own."""
    return [
        system(),
        user(opener),
        {"role": "assistant", "content": f"Hello {name}! What are we working on?"},
        user(f"{name}: the importer, please."),
    ]


def over_threshold(opener: str, name: str) -> list[dict[str, Any]]:
    """About 14k tokens: over the threshold of a 16k window, so the request compacts."""
    return [
        system(),
        user(opener),
        user(f"FACT-2: {name} keeps its notes in /srv/{name}."),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
    ]


async def seed(store: RedisStore, count: int) -> str:
    """``count`` twins, each with a checkpoint on its own branch; their conversation id."""
    tenant = tenant_of(SECRET.encode(), KEY)
    conversation = ""
    for twin in range(count):
        view = RequestView.of(tenant, MODEL, opened_with("hi", f"twin-{twin}"), None)
        conversation = view.conversation
        checkpoint = Checkpoint(
            start=0,
            end=1,
            start_prev_hash=view.root,
            end_hash=view.chain[1],
            message={"role": "user", "content": SUMMARY_TEXT},
            tokens=300,
            shadowed_tokens=400,
            end_fingerprint=branch_fingerprint(view.body_digests, 1),
            context=view.context_fingerprint,
        )
        owner = f"seed-{twin}"
        start = {"type": "compaction/start"}
        await store.begin_compaction(conversation, owner, 30, start, None, view.chain, 1)
        await store.commit_compaction(conversation, owner, [], [checkpoint])
    return conversation


async def post(http: aiohttp.ClientSession, base: str, messages: list[dict[str, Any]]) -> float:
    body = orjson.dumps({"model": MODEL, "messages": messages})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    started = time.perf_counter()
    async with http.post(f"{base}/v1/chat/completions", data=body, headers=headers) as reply:
        await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{reply.status}: {await reply.text()}")
    return time.perf_counter() - started


def milliseconds(values: list[float], share: float) -> str:
    return f"{percentile(values, share) * 1000:6.2f} ms"


async def reads(http: aiohttp.ClientSession, base: str, samples: int) -> None:
    twin: list[float] = []
    fresh: list[float] = []
    for _ in range(20):  # warm up: connections, caches, the tokenizer
        await post(http, base, opened_with(f"warm {uuid.uuid4().hex}", "warm"))
    for sample in range(samples):
        name = f"new-{sample}-{uuid.uuid4().hex[:6]}"
        pair = [
            (twin, opened_with("hi", name)),
            (fresh, opened_with(f"hello {uuid.uuid4().hex}", name)),
        ]
        for latencies, messages in pair if sample % 2 else pair[::-1]:
            latencies.append(await post(http, base, messages))
    ratio = statistics.median(twin) / statistics.median(fresh)
    print(f"  new twin   p50 {milliseconds(twin, 0.5)}  p90 {milliseconds(twin, 0.9)}")
    print(f"  fresh      p50 {milliseconds(fresh, 0.5)}  p90 {milliseconds(fresh, 0.9)}")
    print(f"  new twin / fresh (p50): {ratio:.2f}x")


async def at_once(http: aiohttp.ClientSession, base: str, opener: str | None) -> list[float]:
    histories = [
        over_threshold(opener or f"hello {uuid.uuid4().hex}", f"user-{uuid.uuid4().hex[:6]}")
        for _ in range(5)
    ]
    return list(await asyncio.gather(*(post(http, base, h) for h in histories)))


async def run(twins: int, samples: int, summary_seconds: float) -> None:
    redis = RedisServer()
    await redis.start()
    store = RedisStore(redis.url)
    fake = FakeUpstream(keep_requests=False)
    fake.summary_delay = summary_seconds
    try:
        async with serve(fake) as upstream_url:
            routes = [route(upstream_url, "small-*", WINDOW, precompact_ratio=0)]
            env = {
                "COMPACTION_PROXY_STORE_URL": redis.url,
                "COMPACTION_PROXY_TENANT_SECRET": SECRET,
                "COMPACTION_PROXY_ROUTES": orjson.dumps(routes).decode(),
                "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
            }
            async with proxy_process(env) as (_, base), aiohttp.ClientSession() as http:
                print(f"reads, after {twins} twins with a checkpoint each (Redis):")
                seeded = time.perf_counter()
                await seed(store, twins)
                print(f"  seeded in {time.perf_counter() - seeded:.1f} s")
                await reads(http, base, samples)
                print(f"leases: five at once, summary call {summary_seconds:.1f} s:")
                for label, opener in (("twins", "hi, let us start"), ("fresh", None)):
                    latencies = await at_once(http, base, opener)
                    each = " ".join(f"{value:.2f}" for value in latencies)
                    print(f"  {label:6} {each} s   slowest {max(latencies):.2f} s")
    finally:
        await store.close()
        await redis.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twins", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--summary-seconds", type=float, default=3.0)
    options = parser.parse_args(argv)
    asyncio.run(run(options.twins, options.samples, options.summary_seconds))


if __name__ == "__main__":
    main()
