"""What each stage of a request costs in place: the proxy whole, and with stages left out.

Run: ``python -m tests.bench.stages [--rounds N] [--transcript NAME]``. Not collected by pytest.
Beside the bare relay, the same proxy (``memory://``) runs four times: whole; without its
record after the answer; without preparing (nothing loaded, metered or recorded: the bytes go
on as sent); and without parsing either (``tests.bench.stage_proxy``). Every round replays the
transcript as a fresh conversation, at concurrency 1 and 4, the targets taking turns.

Printed: req/s and its ratio to the relay, the CPU time each process spent per request, with
the difference each stage makes (the CPU of the variant with it less the one
without it). That difference is the stage's cost as served: a step timed in a warm loop costs
a fraction of what it costs between the socket reads and writes of a request, with the client
and the upstream taking turns on the same cores (the meter's measurement of a replayed
request: about 6 us in a loop on a 2-core virtual machine, 80 us and more in place), so this is
where to look before optimizing a step, and after. Also printed: the page faults a process
took per request (touching memory it never had: a few microseconds each on a virtual machine),
which a process whose heap keeps growing pays on every request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import orjson

from tests.bench.overhead import at_rest, cpu_seconds, metered_env, process, replay, rotated
from tests.processes import free_port, proxy_process, wait_until_ready
from tests.transcripts import replay_requests, transcripts

MODEL = "bench-model"
# Each variant and the stages it leaves out, from the whole proxy to the least of it: each
# leaves out one stage more than the one before (leaving out prepare leaves out the record).
VARIANTS = {
    "proxy": "",
    "no record": "record",
    "no prepare": "prepare",
    "no parse": "prepare,parse",
}
STAGE_LEFT_OUT = {"no record": "record", "no prepare": "prepare", "no parse": "parse"}


@asynccontextmanager
async def targets(upstream_port: int) -> AsyncIterator[tuple[dict[str, str], dict[str, int]]]:
    """The relay's and every variant's base URL, and their process ids; stopped on exit."""
    upstream = f"http://127.0.0.1:{upstream_port}"
    relay_port = free_port()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            process(
                "-m",
                "compaction_proxy.testing.fake_upstream",
                "--port",
                str(upstream_port),
                "--instant",
            )
        )
        await wait_until_ready(f"{upstream}/v1/models")
        relay = await stack.enter_async_context(
            process(
                "-m", "tests.bench.relay", "--port", str(relay_port), "--upstream", f"{upstream}/v1"
            )
        )
        bases = {"relay": f"http://127.0.0.1:{relay_port}"}
        pids = {"relay": relay.pid}
        for name, without in VARIANTS.items():
            env = {
                **metered_env(upstream),
                "COMPACTION_PROXY_STORE_URL": "memory://",
                "BENCH_WITHOUT": without,
                "BENCH_MODEL": MODEL,
            }
            proxy, base = await stack.enter_async_context(
                proxy_process(env, module="tests.bench.stage_proxy")
            )
            bases[name], pids[name] = base, proxy.pid
        for base in bases.values():
            await wait_until_ready(f"{base}/v1/models")
        yield bases, pids


async def run(rounds: int, transcript: str | None) -> None:
    every = transcripts()
    chosen = next((t for t in every if transcript and transcript in t.name), every[0])
    bodies = [
        orjson.dumps({"model": MODEL, "messages": history})
        for history in replay_requests(chosen.messages)
    ]
    size = statistics.mean(len(b) for b in bodies)
    print(
        f"transcript {chosen.name}: {len(bodies)} requests per replay, mean body "
        f"{size / 1024:.0f} KiB, {rounds} rounds, a fresh conversation per replay"
    )
    async with targets(free_port()) as (bases, pids):
        await at_rest(list(pids.values()))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            for base in bases.values():
                await replay(http, base, bodies, 1)  # warm-up
            for concurrency in (1, 4):
                rps: dict[str, list[float]] = defaultdict(list)
                cpu: dict[str, float] = defaultdict(float)
                faults: dict[str, int] = defaultdict(int)
                requests: dict[str, int] = defaultdict(int)
                for turn in range(rounds):
                    for name, base in rotated(bases, turn):
                        before = cpu_seconds(pids[name]), page_faults(pids[name])
                        done, wall = await replay(http, base, bodies, concurrency)
                        cpu[name] += cpu_seconds(pids[name]) - before[0]
                        faults[name] += page_faults(pids[name]) - before[1]
                        requests[name] += sum(map(len, done))
                        rps[name].append(sum(map(len, done)) / wall)
                per_request = {n: cpu[n] / requests[n] for n in bases}
                report(concurrency, rps, per_request, {n: faults[n] / requests[n] for n in bases})


def page_faults(pid: int) -> int:
    """Minor page faults process ``pid`` has taken (Linux /proc)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[7])


def report(
    concurrency: int, rps: dict[str, list[float]], cpu: dict[str, float], faults: dict[str, float]
) -> None:
    """A line per target; a variant's line says what the stage it leaves out (beyond the
    variant before it) cost: that variant's CPU per request less its own."""
    print(f"\nconcurrency {concurrency}")
    print(
        f"{'target':<12}{'req/s':>9}{'/ relay':>9}{'CPU ms/req':>12}{'faults/req':>12}"
        "   stage: CPU ms/req"
    )
    relay_rps = statistics.median(rps["relay"])
    variants = list(VARIANTS)
    for name in ("relay", *variants):
        median = statistics.median(rps[name])
        line = (
            f"{name:<12}{median:>9.1f}{median / relay_rps:>8.2f}x{cpu[name] * 1000:>12.2f}"
            f"{faults[name]:>12.1f}"
        )
        if name in STAGE_LEFT_OUT:
            before = variants[variants.index(name) - 1]
            line += f"   {STAGE_LEFT_OUT[name]}: {(cpu[before] - cpu[name]) * 1000:.2f}"
        print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--transcript", help="part of a transcript file name")
    args = parser.parse_args(argv)
    asyncio.run(run(args.rounds, args.transcript))


if __name__ == "__main__":
    main()
