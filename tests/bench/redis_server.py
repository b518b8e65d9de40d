"""The Redis server's instructions a request, counted while the proxy runs at native speed.

Run: ``python -m tests.bench.redis_server [--against DIR] [--transcript NAME] [--rounds 2]
[--format chat|responses|messages]``. Not collected by pytest; needs ``valgrind``.

Each checkout (this one; with ``--against``, another) gets a Redis server of its own under
callgrind and a proxy on it at native speed (``serve``, from that checkout). After a warm-up
replay (a fresh conversation each), the server's counts are zeroed, ``--rounds`` replays sent,
and the counts dumped: its instructions divided by the requests, and from ``INFO
commandstats`` each command's calls a request (the scripts' own calls included). The figure
is what the scripts and the commands around them cost, and a change to ``store/lua`` moves
it alone: two runs of one checkout agree within 0.5 %. A run takes about a minute.

Why beside ``tests.bench.instruction_count``, which counts the server too: there the proxy
runs under callgrind, a replay lasts minutes, and the server's housekeeping (its cron, ten
times a second) counts all the while, so its figure grows with how slowly the proxy ran (one
tree read 0.666 M a request there, 0.590 M here).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

import aiohttp
import orjson
import redis.asyncio as aioredis

from tests.bench.instruction_count import CountedRedis, add_replay_arguments, replay
from tests.bench.overhead import metered_env, process
from tests.bench.request_forms import REQUEST_FORMS, RequestForm
from tests.processes import free_port, proxy_process, wait_until_ready
from tests.transcripts import replay_requests, transcripts

SHOWN_CALLS = 0.05  # commands called less often a request are left out of the list


async def command_calls(url: str) -> dict[str, int]:
    """``INFO commandstats``: each command's calls since the counts were last reset."""
    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def reset_command_calls(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_resetstat()
    finally:
        await client.aclose()


async def count(
    checkout: str, upstream: str, bodies: list[bytes], rounds: int, form: RequestForm, work: Path
) -> tuple[float, dict[str, float]]:
    """The server's instructions a request over ``rounds`` replays, and each command's calls a
    request."""
    redis = CountedRedis(work)
    await redis.server.start()
    try:
        env = {**metered_env(upstream), "COMPACTION_PROXY_STORE_URL": redis.server.url}
        async with proxy_process(env, cwd=checkout) as (_, base), aiohttp.ClientSession() as http:
            await replay(http, base, bodies, form)
            await asyncio.sleep(1.0)  # the last record, written after its answer
            await reset_command_calls(redis.server.url)
            await redis.zero()
            for _ in range(rounds):
                await replay(http, base, bodies, form)
            await asyncio.sleep(1.0)
            instructions = await redis.dump()
            counted = await command_calls(redis.server.url)
    finally:
        await redis.server.stop()
    requests = rounds * len(bodies)
    calls = {name: n / requests for name, n in counted.items() if name != "config|resetstat"}
    return instructions / requests / 1e6, calls


async def run(args: argparse.Namespace) -> None:
    every = transcripts()
    chosen = next((t for t in every if args.transcript in t.name), every[0])
    form = REQUEST_FORMS[args.form]
    bodies = [orjson.dumps(form.body_of(history)) for history in replay_requests(chosen.messages)]
    print(f"transcript {chosen.name} as {args.form}: {len(bodies)} requests a replay")
    checkouts = {"redis": os.getcwd()}
    if args.against:
        checkouts["redis@"] = args.against
    work = Path(tempfile.mkdtemp(prefix="redis-server-"))
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    fake = ("-m", "compaction_proxy.testing.fake_upstream", "--port", str(port), "--instant")
    results = {}
    try:
        async with process(*fake):
            await wait_until_ready(f"{upstream}/v1/models")
            for name, checkout in checkouts.items():
                results[name] = await count(checkout, upstream, bodies, args.rounds, form, work)
                print(f"{name:<8}{results[name][0]:8.3f} M instructions a request", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = list(results)
    if len(names) == 2:
        ratio = results["redis"][0] / results["redis@"][0]
        print(f"x{ratio:.3f} the other checkout's")
    commands = sorted(
        {c for _, calls in results.values() for c, n in calls.items() if n >= SHOWN_CALLS},
        key=lambda c: -results["redis"][1].get(c, 0.0),
    )
    print(f"\n{'calls a request':<22}" + "".join(f"{n:>10}" for n in names))
    for command in commands:
        cells = "".join(f"{results[n][1].get(command, 0.0):10.2f}" for n in names)
        print(f"  {command:<20}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_replay_arguments(parser)
    args = parser.parse_args()
    args.against = os.path.abspath(args.against) if args.against else None
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
