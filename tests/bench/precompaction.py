"""Compaction ahead of need, measured: precompaction on and off, side by side in one run.

Run: ``python -m tests.bench.precompaction [--windows 16000 32000] [--summary-seconds 3]``.
Not collected by pytest. Every transcript is replayed as its agent sent it (the whole history
before every assistant message), all transcripts at once, each as its own tenant, against three
targets at the same time:

* ``direct``: the fake upstream with no window, no proxy: the latency without compaction;
* ``sync``: a proxy process with ``precompact_ratio: 0`` (compaction only at the threshold);
* ``ahead``: a proxy process with the default ``precompact_ratio``.

The proxied fakes enforce the window. A model answer takes ``--model-seconds``, a summary call
``--summary-seconds`` in all, and the agent spends ``--tool-seconds`` between turns. Printed per
window and mode: client latency p50 / p99 / max over all requests, the latency of the requests
that compacted synchronously in ``sync`` mode (the same requests in every mode), requests that
waited on a summary in each mode, summary calls, forwarded/raw tokens, and the provider-cache hit
ratio: the share of forwarded prompt tokens that repeat a prefix the upstream already saw in
the same conversation (prefixes compared message by message, as providers cache them). "slow"
counts requests that took half a second longer than a model answer, whatever their status;
"past window" those of them that arrived over the window (about: the proxy's estimate of the
surface before compacting), so that no proxy could have sent them as they came.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.caching import bills_by_conversation
from tests.bench.overhead import percentile
from tests.processes import free_port, proxy_process
from tests.transcripts import BASH_TOOL, Transcript, plant_facts, replay_requests, transcripts

MODEL = "bench-model"
MODES = ("direct", "sync", "ahead")
UNLIMITED = 10_000_000
# The status of a request that waited for a summary (its own, or a round in flight).
WAITED = {"compacted"}


@dataclass
class Replay:
    """One transcript replayed against one target: per request, latency and status."""

    transcript: str
    latencies: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    forwarded: list[int] = field(default_factory=list)  # the proxy's estimate of what it sent
    client: list[int] = field(default_factory=list)  # and of the client's own messages

    def arrived_with(self, i: int) -> int:
        """About the tokens request ``i`` would have been forwarded with, before compacting:
        the previous request's surface plus what the client added since."""
        if i == 0:
            return self.client[0]
        return self.forwarded[i - 1] + self.client[i] - self.client[i - 1]


@asynccontextmanager
async def serve(fake: FakeUpstream) -> AsyncIterator[str]:
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def proxy_env(upstream: str, window: int, precompact: float | None) -> dict[str, str]:
    route = {"model": MODEL, "base_url": upstream, "context_window": window}
    env = {
        "COMPACTION_PROXY_ROUTES": orjson.dumps([route]).decode(),
        "COMPACTION_PROXY_TENANT_SECRET": "bench-tenant-secret",
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
        "COMPACTION_PROXY_STORE_URL": "memory://",
    }
    if precompact is not None:
        env["COMPACTION_PROXY_POLICY__PRECOMPACT_RATIO"] = str(precompact)
    return env


async def replay(
    http: aiohttp.ClientSession,
    base: str,
    transcript: Transcript,
    tool_seconds: float,
) -> Replay:
    messages = plant_facts(transcript.messages, "bench")
    extra = {"tools": BASH_TOOL} if any(m.get("tool_calls") for m in messages) else {}
    # One tenant per conversation, as one user's agent: the per-tenant ceiling is not measured.
    headers = {"Authorization": f"Bearer sk-{uuid.uuid4().hex}"}
    result = Replay(transcript.name)
    for history in replay_requests(messages):
        body = orjson.dumps({"model": MODEL, "messages": history, **extra})
        started = time.perf_counter()
        async with http.post(
            f"{base}/chat/completions",
            data=body,
            headers={**headers, "Content-Type": "application/json"},
        ) as response:
            answer = await response.read()
            assert response.status == 200, (response.status, answer[:300])
            result.latencies.append(time.perf_counter() - started)
            result.statuses.append(response.headers.get("X-Compaction-Status", "direct"))
            forwarded = int(response.headers.get("X-Compaction-Tokens", "0"))
            result.forwarded.append(forwarded)
            result.client.append(int(response.headers.get("X-Compaction-Tokens-Before", forwarded)))
        await asyncio.sleep(tool_seconds)
    return result


def cache_hit_ratio(fake: FakeUpstream) -> float:
    """Share of forwarded prompt tokens in a message prefix the upstream saw before, in the
    same conversation (client requests only: summary calls are counted apart)."""
    bills = bills_by_conversation(fake, fake.chat_requests).values()
    cached = sum(b.cached for b in bills)
    total = sum(b.prompt for b in bills)
    return cached / total if total else 0.0


def forwarded_tokens(fake: FakeUpstream) -> int:
    return sum(r.prompt_tokens for r in fake.chat_requests)


def fits(transcript: Transcript, window: int, fake: FakeUpstream) -> bool:
    """Whether every message the agent sent fits in 3/4 of the window (else no client could
    send that turn directly either)."""
    sent = max(len(h) for h in replay_requests(transcript.messages))
    largest = max(
        fake.prompt_tokens({"messages": [m]})
        for m in transcript.messages[:sent]
        if m.get("role") != "assistant"
    )
    return largest <= 0.75 * window


async def run_window(
    window: int, chosen: list[Transcript], args: argparse.Namespace
) -> dict[str, tuple[list[Replay], FakeUpstream]]:
    fakes = {
        mode: FakeUpstream(
            default_window=UNLIMITED if mode == "direct" else window,
            response_delay=args.model_seconds,
            summary_delay=max(0.0, args.summary_seconds - args.model_seconds),
        )
        for mode in MODES
    }
    async with AsyncExitStack() as stack:
        bases = {mode: await stack.enter_async_context(serve(fakes[mode])) for mode in MODES}
        for mode, precompact in (("sync", 0.0), ("ahead", None)):
            env = proxy_env(bases[mode], window, precompact)
            _, proxy_base = await stack.enter_async_context(proxy_process(env))
            bases[mode] = f"{proxy_base}/v1"
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            runs = [
                replay(http, bases[mode], transcript, args.tool_seconds)
                for transcript in chosen
                for mode in MODES
            ]
            replays = await asyncio.gather(*runs)
    by_mode: dict[str, list[Replay]] = {mode: [] for mode in MODES}
    for i, result in enumerate(replays):
        by_mode[MODES[i % len(MODES)]].append(result)
    return {mode: (by_mode[mode], fakes[mode]) for mode in MODES}


def report(
    window: int, results: dict[str, tuple[list[Replay], FakeUpstream]], model_seconds: float
) -> None:
    sync_replays = results["sync"][0]
    raw = forwarded_tokens(results["direct"][1])
    print(f"\nwindow {window // 1000}k, {len(sync_replays)} conversations")
    print(
        f"{'mode':<8}{'requests':>9}{'p50 s':>8}{'p99 s':>8}{'max s':>8}"
        f"{'crossing p50':>14}{'crossing max':>14}{'waited':>8}{'slow':>6}{'past window':>13}"
        f"{'summaries':>11}"
        f"{'fwd/raw':>9}{'cache hit':>11}"
    )
    for mode, (replays, fake) in results.items():
        every = [x for r in replays for x in r.latencies]
        # The requests that compacted synchronously without precompaction, in every mode.
        crossing = [
            replays[i].latencies[j]
            for i, sync in enumerate(sync_replays)
            for j, status in enumerate(sync.statuses)
            if status in WAITED
        ]
        waited = sum(s in WAITED for r in replays for s in r.statuses)
        slow_ones = [
            (r, i) for r in replays for i, x in enumerate(r.latencies) if x > model_seconds + 0.5
        ]
        slow = len(slow_ones)
        # Slow requests that arrived past the window: none could be sent as it came.
        beyond = sum(r.arrived_with(i) > window for r, i in slow_ones)
        summaries = len(fake.summary_requests)
        print(
            f"{mode:<8}{len(every):>9}{percentile(every, 0.5):>8.2f}"
            f"{percentile(every, 0.99):>8.2f}{max(every):>8.2f}"
            f"{statistics.median(crossing) if crossing else 0:>14.2f}"
            f"{max(crossing, default=0):>14.2f}{waited:>8}{slow:>6}"
            f"{beyond if mode != 'direct' else '-':>13}{summaries:>11}"
            f"{forwarded_tokens(fake) / raw:>9.1%}{cache_hit_ratio(fake):>11.1%}"
        )
    sync_calls = len(results["sync"][1].summary_requests)
    ahead_calls = len(results["ahead"][1].summary_requests)
    hit_gap = cache_hit_ratio(results["ahead"][1]) - cache_hit_ratio(results["sync"][1])
    print(
        f"ahead/sync: summary calls x{ahead_calls / max(1, sync_calls):.2f}, "
        f"cache hit {hit_gap * 100:+.1f} points"
    )


async def run(args: argparse.Namespace) -> None:
    every = transcripts()
    if args.transcripts:
        every = every[: args.transcripts]
    counter = FakeUpstream()
    print(
        f"model answer {args.model_seconds}s, summary call {args.summary_seconds}s, "
        f"agent between turns {args.tool_seconds}s"
    )
    for window in args.windows:
        chosen = [t for t in every if fits(t, window, counter)]
        report(window, await run_window(window, chosen, args), args.model_seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", type=int, nargs="+", default=[16_000, 32_000])
    parser.add_argument("--summary-seconds", type=float, default=3.0)
    parser.add_argument("--model-seconds", type=float, default=0.5)
    parser.add_argument("--tool-seconds", type=float, default=0.5)
    parser.add_argument("--transcripts", type=int, help="replay only the first N")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
