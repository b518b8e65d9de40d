"""What compaction costs and saves on a provider that caches prompt prefixes, per price model.

Run: ``python -m tests.bench.cost [--formats chat,responses,messages] [--presets anthropic,
openai,openai-5.6,deepseek,none] [--masking on|off|both] [--target 32000] [--window 128000]``. Not
collected by pytest. Every transcript is replayed, as its agent sent it, through a proxy
process whose route sets the model's window (``--window``) and a soft target under it
(``target_tokens``, ``--target``; ``--cap`` instead makes the target the route's hard
``context_window``, as before soft targets), with the route's ``pricing`` set to the preset
being measured, so the proxy chooses its steps on the terms it is billed on. One replay per
format, preset and masking setting. ``--against DIR`` runs another checkout's proxy (an earlier
commit's, with ``--cap``) to compare transcript by transcript on the same bill.

Printed per replay and transcript: forwarded/raw prompt tokens, the provider-cache hit ratio
of what was forwarded (summary calls included), the bill against the raw history billed the
same way (the preset's cache read, write and output prices: ``compaction.cache_prices``), the
bill on a provider that caches nothing, and the summary calls made; a row for the shared
transcripts alone (those of ``TRANSCRIPTS_DIR``) and one for all. Then where the bill goes
(``caching.Spend``): the new tokens every client pays for (a floor no compactor goes under),
the tokens written again behind a changed prefix, the cache reads and the summary calls. Last,
one line per format and preset with the goals: the shared transcripts' bill, the dearest
transcript's, the hit ratio and the summary calls.

Chat requests are billed by prefix (``caching.PrefixCache``; on the ``openai-5.6`` preset
only prefixes ending at OpenAI's implicit breakpoints are read); Responses requests by their
input items the same way, their summary calls (made in chat form) beside them; Messages
requests carry breakpoints where Claude Code places them and are billed by Anthropic's rules
(``caching.BreakpointCache``). Token savings alone mislead: a compactor that breaks prefix
caching can cost more than sending everything.
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

from compaction_proxy.compaction.cache_prices import PRESETS, CachePrices
from compaction_proxy.testing.fake_answers import is_summary_request
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.caching import (
    Bill,
    BreakpointCache,
    PrefixCache,
    at_implicit_breakpoints,
    bills_by_conversation,
    breakpoint_bills,
    responses_bills,
    responses_units,
)
from tests.bench.precompaction import serve
from tests.processes import proxy_process
from tests.transcripts import (
    BASH_TOOL,
    Transcript,
    as_messages_body,
    as_responses_body,
    plant_facts,
    replay_requests,
    transcript_paths,
    transcripts,
)

MODEL = "bench-model"
FORMATS = ("chat", "responses", "messages")
COUNTERS = ("compaction_proxy_compactions_total", "compaction_proxy_masked_rereads_total")
PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def request_body(api: str, history: list[dict[str, Any]], tools: bool) -> dict[str, Any]:
    if api == "messages":
        return as_messages_body(MODEL, history)
    if api == "responses":
        return as_responses_body(MODEL, history)
    return {"model": MODEL, "messages": history, **({"tools": BASH_TOOL} if tools else {})}


async def replay(
    http: aiohttp.ClientSession, base: str, transcript: Transcript, gap: float, api: str
) -> tuple[str, list[dict[str, Any]]]:
    """One conversation as its agent sent it; its key and the raw request bodies."""
    messages = plant_facts(transcript.messages, "cost")
    tools = any(m.get("tool_calls") for m in messages)
    key = f"sk-{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if api == "messages":
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    sent = []
    for history in replay_requests(messages):
        body = request_body(api, history, tools)
        async with http.post(
            f"{base}{PATHS[api]}", data=orjson.dumps(body), headers=headers
        ) as reply:
            assert reply.status == 200, (reply.status, await reply.text())
        sent.append(body)
        await asyncio.sleep(gap)  # the agent's turn: background compaction runs meanwhile
    return key, sent


@dataclass(frozen=True)
class Setup:
    """One replay's configuration: the wire format, the price preset, masking on or off."""

    api: str
    preset: str
    masking: bool

    @property
    def prices(self) -> CachePrices:
        return PRESETS[self.preset]

    @property
    def label(self) -> str:
        return f"{self.api}, {self.preset}, masking {'on' if self.masking else 'off'}"


@dataclass
class Outcome:
    """One setup's replay of every transcript: per transcript, the forwarded bill, the raw
    history's bill and the summary calls made."""

    setup: Setup
    forwarded: list[Bill]
    raw: list[Bill]
    summaries: list[int]


def route_of(args: argparse.Namespace, upstream: str, setup: Setup) -> dict[str, Any]:
    policy: dict[str, Any] = {
        **orjson.loads(args.policy),
        "masking": {"enabled": setup.masking, "clear_at_least": args.clear_at_least},
    }
    route: dict[str, Any] = {"model": MODEL, "base_url": upstream}
    if args.cap:  # the target as the hard window, as before soft targets (and no pricing)
        route["context_window"] = args.target
    else:
        route["context_window"] = args.window
        policy["target_tokens"] = args.target
        policy["pricing"] = {"preset": setup.preset}
    route["policy"] = policy
    return route


def raw_bill(setup: Setup, fake: FakeUpstream, key: str, sent: list[dict[str, Any]]) -> Bill:
    """The conversation's requests as the agent sent them, billed on the same terms."""
    raw = Bill(setup.prices)
    cache: BreakpointCache | PrefixCache
    cache = (
        BreakpointCache(fake)
        if setup.api == "messages"
        else PrefixCache(fake, at_implicit_breakpoints(setup.prices))
    )
    for body in sent:
        if isinstance(cache, BreakpointCache):
            cache.send(key, body, raw)
        elif setup.api == "responses":
            cache.send(key, responses_units(body), raw)
        else:
            cache.send(key, body["messages"], raw)
    return raw


async def measure(args: argparse.Namespace, every: list[Transcript], setup: Setup) -> Outcome:
    """Every transcript replayed through a proxy set up as ``setup`` says."""
    fake = FakeUpstream(default_window=args.window)
    async with serve(fake) as upstream:
        env = {
            "COMPACTION_PROXY_ROUTES": orjson.dumps([route_of(args, upstream, setup)]).decode(),
            "COMPACTION_PROXY_TENANT_SECRET": "bench-cost",
            "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
        }
        async with (
            proxy_process(env, cwd=args.against) as (_, base),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http,
        ):
            replays = await asyncio.gather(
                *(replay(http, f"{base}/v1", t, args.gap, setup.api) for t in every)
            )
            if args.metrics:
                async with http.get(f"{base}/metrics") as scraped:
                    counters = (await scraped.text()).splitlines()
                print(*(line for line in counters if line.startswith(COUNTERS)), sep="\n")
    prices, header = setup.prices, "Authorization"
    if setup.api == "messages":
        header = "x-api-key"
        forwarded = breakpoint_bills(fake, header, prices)
        calls: list[dict[str, Any] | None] = [r.body for r in fake.messages.received]
        senders = [r.headers.get(header, "") for r in fake.messages.received]
    else:
        if setup.api == "responses":
            forwarded = responses_bills(fake, header, prices)
        else:
            forwarded = bills_by_conversation(fake, fake.received, header, prices)
        calls = [r.body for r in fake.received]
        senders = [r.headers.get(header, "") for r in fake.received]
        if setup.api == "responses":  # cache-safe summary calls go in the client's format
            calls += fake.responses.received
            senders += [h.get(header, "") for h in fake.responses.headers_received]
    forwarded = {key.removeprefix("Bearer "): bill for key, bill in forwarded.items()}
    summaries: Counter[str] = Counter()
    for body, sender in zip(calls, senders, strict=True):
        if body is not None and is_summary_request(body):
            summaries[sender.removeprefix("Bearer ")] += 1
    outcome = Outcome(setup, [], [], [])
    for key, sent in replays:
        outcome.forwarded.append(forwarded[key])
        outcome.raw.append(raw_bill(setup, fake, key, sent))
        outcome.summaries.append(summaries[key])
    return outcome


SPLIT = ["new", "rewrites", "reads", "summaries", "total"]


def total(bills: list[Bill], prices: CachePrices) -> Bill:
    whole = Bill(prices)
    for bill in bills:
        whole.add(bill)
    return whole


def columns(bill: Bill, raw: Bill, summaries: int) -> str:
    return (
        f"{bill.prompt / raw.prompt:>9.1%}{bill.hit_ratio:>6.2f}"
        f"{bill.units / raw.units:>8.3f}x{bill.uncached_units / raw.uncached_units:>8.3f}x"
        f"{summaries:>5}"
    )


@dataclass(frozen=True)
class Totals:
    """One outcome summed over some transcripts: the forwarded bill, the raw one, the
    summary calls, and the dearest transcript's bill over its raw one."""

    forwarded: Bill
    raw: Bill
    summaries: int
    dearest: float

    @classmethod
    def of(cls, outcome: Outcome, indexes: list[int]) -> Totals:
        prices = outcome.setup.prices
        return cls(
            total([outcome.forwarded[i] for i in indexes], prices),
            total([outcome.raw[i] for i in indexes], prices),
            sum(outcome.summaries[i] for i in indexes),
            max(
                (outcome.forwarded[i].units / outcome.raw[i].units for i in indexes),
                default=0.0,
            ),
        )


def short_name(name: str, width: int = 39) -> str:
    """A transcript's name in ``width`` characters: its agent's model and its task's end."""
    if len(name) <= width:
        return name
    return f"{name[:12]}…{name[-(width - 13) :]}"


def report(outcome: Outcome, every: list[Transcript], shared: list[int]) -> None:
    """One setup's table: per transcript, the shared ones, all; then where the bill goes."""
    prices = outcome.setup.prices
    print(
        f"\n{outcome.setup.label}: cache reads {prices.read}x, writes {prices.write}x, "
        f"output {prices.output}x"
    )
    row = f"{'fwd/raw':>9}{'hit':>6}{'billed':>9}{'uncached':>9}{'sums':>5}"
    print(f"{'transcript':<40}{'raw hit':>8}{row}")
    for index, transcript in enumerate(every):
        raw = outcome.raw[index]
        cells = columns(outcome.forwarded[index], raw, outcome.summaries[index])
        print(f"{short_name(transcript.name):<40}{raw.hit_ratio:>8.2f}{cells}")
    groups = [("shared", shared), ("all", list(range(len(every))))]
    for name, indexes in groups:
        if indexes:
            sums = Totals.of(outcome, indexes)
            cells = columns(sums.forwarded, sums.raw, sums.summaries)
            print(f"{name:<40}{sums.raw.hit_ratio:>8.2f}{cells}")
    whole = Totals.of(outcome, list(range(len(every))))
    print(f"{'where the bill goes, x the raw bill':<40}" + "".join(f"{h:>10}" for h in SPLIT))
    for name, bill in (("raw history", whole.raw), ("forwarded", whole.forwarded)):
        spend = bill.spend
        parts = [spend.new, spend.rewrites, spend.reads, spend.summaries, bill.units]
        print(f"{name:<40}" + "".join(f"{part / whole.raw.units:>10.3f}" for part in parts))


def goals(outcomes: list[Outcome], every: list[Transcript], shared: list[int]) -> None:
    """One line per setup: the shared transcripts' bill over raw (or all, without them), the
    dearest transcript's, forwarded/raw, the hit ratio and the summary calls."""
    indexes = shared or list(range(len(every)))
    scope = "shared" if shared else "all (no shared transcripts here)"
    print(f"\nper setup, over {scope}; the dearest over every transcript")
    print(
        f"{'setup':<36}{'billed':>8}{'dearest':>9}{'fwd/raw':>9}{'hit':>6}{'sums':>6}"
        f"{'uncached':>10}"
    )
    for outcome in outcomes:
        sums = Totals.of(outcome, indexes)
        dearest = Totals.of(outcome, list(range(len(every)))).dearest
        print(
            f"{outcome.setup.label:<36}{sums.forwarded.units / sums.raw.units:>7.3f}x"
            f"{dearest:>8.2f}x{sums.forwarded.prompt / sums.raw.prompt:>9.1%}"
            f"{sums.forwarded.hit_ratio:>6.2f}{sums.summaries:>6}"
            f"{sums.forwarded.uncached_units / sums.raw.uncached_units:>9.3f}x"
        )


async def run(args: argparse.Namespace) -> None:
    every = [t for t in transcripts() if args.only in t.name]
    real = {path.name.split(".")[0] for path in transcript_paths()}
    shared = [i for i, t in enumerate(every) if t.name in real]
    maskings = {"on": [True], "off": [False], "both": [False, True]}[args.masking]
    setups = [
        Setup(api, preset, masking)
        for api in args.formats.split(",")
        for preset in args.presets.split(",")
        for masking in maskings
    ]
    where = (
        f"hard window {args.target // 1000}k"
        if args.cap
        else (f"target {args.target // 1000}k in a {args.window // 1000}k window")
    )
    print(f"{len(every)} transcripts ({len(shared)} shared), {where}")
    outcomes = []
    for setup in setups:
        outcome = await measure(args, every, setup)
        report(outcome, every, shared)
        outcomes.append(outcome)
    goals(outcomes, every, shared)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=int, default=32_000, help="the route's target_tokens")
    parser.add_argument("--window", type=int, default=128_000, help="the model's window")
    parser.add_argument(
        "--cap", action="store_true", help="the target as the hard context_window, no pricing"
    )
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between an agent's turns")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument(
        "--against",
        default=None,
        help="run the proxy of another checkout (with --cap: it may know no soft target)",
    )
    parser.add_argument("--only", default="", help="only the transcripts whose name holds it")
    parser.add_argument("--metrics", action="store_true", help="print the compaction counters")
    parser.add_argument("--presets", default="anthropic,openai,openai-5.6,deepseek,none")
    parser.add_argument(
        "--masking",
        choices=["both", "on", "off"],
        default="on",
        help="replay with observation masking on (the default policy), off, or both",
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
