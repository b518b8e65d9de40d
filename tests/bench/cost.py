"""What compaction costs and saves on a provider that caches prompt prefixes.

Run: ``python -m tests.bench.cost [--window 32000] [--upstream-window 128000] [--format
messages] [--masking both|on|off]``. Not collected by pytest. Every transcript is replayed
through a proxy process whose route caps the context at ``--window`` in front of a model with a
larger one, so nothing overflows and the raw history is a fair baseline. Printed per transcript:
forwarded/raw prompt tokens, the provider-cache hit ratio of what was forwarded (summary calls
included) next to the raw history's, the bill (cache reads at 0.1x, writes at 1.25x, summary
output at 4x, against the raw history billed the same way), the bill on a provider that caches
nothing (every prompt token at 1x) and the summary calls made. Then where the bill goes, raw
and forwarded (``caching.Spend``): the new tokens every client pays for (a floor no compactor
goes under), the tokens written again behind a changed prefix, the cache reads and the summary
calls. By default every transcript is
replayed twice, with observation masking off and on, side by side. Token savings alone mislead:
a compactor that breaks prefix caching can cost more than sending everything.

With ``--format messages`` the conversations go as Anthropic Messages requests with breakpoints
where Claude Code places them (the system prompt, the tool, the newest user block), billed by
Anthropic's rules (``caching.BreakpointCache``): read at a breakpoint or up to 20 blocks before
one, written up to the last one, plain after it.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from compaction_proxy.testing.fake_answers import is_summary_request
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.caching import (
    Bill,
    BreakpointCache,
    PrefixCache,
    bills_by_conversation,
    breakpoint_bills,
)
from tests.bench.precompaction import serve
from tests.e2e.test_transcript_replay import BASH_TOOL, plant_facts
from tests.processes import proxy_process
from tests.transcripts import Transcript, as_messages_body, replay_requests, transcripts

MODEL = "bench-model"


async def replay(
    http: aiohttp.ClientSession, base: str, transcript: Transcript, gap: float, messages_api: bool
) -> tuple[str, list[dict[str, Any]]]:
    """One conversation as its agent sent it; its key and the raw request bodies."""
    messages = plant_facts(transcript.messages, "cost")
    extra = {"tools": BASH_TOOL} if any(m.get("tool_calls") for m in messages) else {}
    key = f"sk-{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    path = "/chat/completions"
    if messages_api:
        headers, path = {"x-api-key": key, "anthropic-version": "2023-06-01"}, "/messages"
    sent = []
    for history in replay_requests(messages):
        body: dict[str, Any] = {"model": MODEL, "messages": history, **extra}
        if messages_api:
            body = as_messages_body(MODEL, history)
        async with http.post(f"{base}{path}", data=orjson.dumps(body), headers=headers) as reply:
            assert reply.status == 200, (reply.status, await reply.text())
        sent.append(body)
        await asyncio.sleep(gap)  # the agent's turn: background compaction runs meanwhile
    return key, sent


@dataclass
class Outcome:
    """One configuration's replay of every transcript: per transcript, the forwarded bill,
    the raw history's bill and the summary calls made."""

    forwarded: list[Bill]
    raw: list[Bill]
    summaries: list[int]


async def measure(args: argparse.Namespace, every: list[Transcript], masking: bool) -> Outcome:
    """Every transcript replayed through a proxy with masking on or off."""
    fake = FakeUpstream(default_window=args.upstream_window)
    messages_api = args.format == "messages"
    async with serve(fake) as upstream:
        route = {
            "model": MODEL,
            "base_url": upstream,
            "context_window": args.window,
            "policy": {
                **orjson.loads(args.policy),
                "masking": {"enabled": masking, "clear_at_least": args.clear_at_least},
            },
        }
        env = {
            "COMPACTION_PROXY_ROUTES": orjson.dumps([route]).decode(),
            "COMPACTION_PROXY_TENANT_SECRET": "bench-cost",
            "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
        }
        async with (
            proxy_process(env) as (_, base),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http,
        ):
            replays = await asyncio.gather(
                *(replay(http, f"{base}/v1", t, args.gap, messages_api) for t in every)
            )
    raw_cache: BreakpointCache | PrefixCache
    header = "x-api-key" if messages_api else "Authorization"
    if messages_api:
        forwarded, raw_cache = breakpoint_bills(fake), BreakpointCache(fake)
    else:
        forwarded = bills_by_conversation(fake, fake.received, header)
        forwarded = {key.removeprefix("Bearer "): bill for key, bill in forwarded.items()}
        raw_cache = PrefixCache(fake)
    summaries: Counter[str] = Counter()
    for received in fake.messages.received if messages_api else fake.received:
        if received.body is not None and is_summary_request(received.body):
            summaries[received.headers.get(header, "").removeprefix("Bearer ")] += 1
    outcome = Outcome([], [], [])
    for key, sent in replays:
        raw = Bill()
        for body in sent:
            if isinstance(raw_cache, BreakpointCache):
                raw_cache.send(key, body, raw)
            else:
                raw_cache.send(key, body["messages"], raw)
        outcome.forwarded.append(forwarded[key])
        outcome.raw.append(raw)
        outcome.summaries.append(summaries[key])
    return outcome


SPLIT = ["new", "rewrites", "reads", "summaries", "total"]


def total(bills: list[Bill]) -> Bill:
    whole = Bill()
    for bill in bills:
        whole.add(bill)
    return whole


def columns(bill: Bill, raw: Bill, summaries: int) -> str:
    return (
        f"{bill.prompt / raw.prompt:>9.1%}{bill.hit_ratio:>6.2f}"
        f"{bill.units / raw.units:>8.2f}x{bill.uncached_units / raw.uncached_units:>8.2f}x"
        f"{summaries:>5}"
    )


async def run(args: argparse.Namespace) -> None:
    every = transcripts()
    configurations = {"on": [True], "off": [False], "both": [False, True]}[args.masking]
    outcomes = [await measure(args, every, masking) for masking in configurations]
    print(
        f"{args.format}: window {args.window // 1000}k on a {args.upstream_window // 1000}k "
        "model; cache reads 0.1x, writes 1.25x, summary output 4x"
    )
    labels = ["masking " + ("on" if masking else "off") for masking in configurations]
    print(f"{'':<44}" + "".join(f"{label:^42}" for label in labels))
    row = f"{'fwd/raw':>9}{'hit':>6}{'billed':>9}{'uncached':>9}{'sums':>5}"
    print(f"{'transcript':<40}{'raw hit':>8}" + "     ".join(row for _ in outcomes))
    for index, transcript in enumerate(every):
        raw = outcomes[0].raw[index]
        cells = "     ".join(
            columns(o.forwarded[index], o.raw[index], o.summaries[index]) for o in outcomes
        )
        print(f"{transcript.name[:39]:<40}{raw.hit_ratio:>8.2f}{cells}")
    raw_total = total(outcomes[0].raw)
    cells = "     ".join(
        columns(total(o.forwarded), total(o.raw), sum(o.summaries)) for o in outcomes
    )
    print(f"{'all':<40}{raw_total.hit_ratio:>8.2f}{cells}")
    print()
    print(f"{'where the bill goes, x the raw bill':<40}" + "".join(f"{h:>10}" for h in SPLIT))
    bills = [
        ("raw history", raw_total),
        *(
            (f"forwarded, {label}", total(o.forwarded))
            for label, o in zip(labels, outcomes, strict=True)
        ),
    ]
    for name, bill in bills:
        spend = bill.spend
        parts = [spend.new, spend.rewrites, spend.reads, spend.summaries, bill.units]
        print(f"{name:<40}" + "".join(f"{part / raw_total.units:>10.3f}" for part in parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", type=int, default=32_000, help="the route's context_window")
    parser.add_argument("--upstream-window", type=int, default=128_000)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between an agent's turns")
    parser.add_argument("--format", choices=["chat", "messages"], default="chat")
    parser.add_argument(
        "--masking",
        choices=["both", "on", "off"],
        default="both",
        help="replay with observation masking off, on, or both side by side",
    )
    parser.add_argument(
        "--clear-at-least", type=int, default=None, help="policy.masking.clear_at_least"
    )
    parser.add_argument(
        "--policy", default="{}", help="more of the route's policy, as JSON (thresholds, ...)"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
