"""Where a request's CPU time goes, sampled by ``perf`` at native speed: by shared object and
by symbol, for the relay and each proxy set-up, and Redis's side by command.

Run: ``python -m tests.bench.cpu_profile [--against DIR] [--against-python PATH]
[--transcript NAME] [--rounds N] [--format chat|responses|messages] [--top N]`` (6 replays by
default; ``--against-python``: the ``@`` set-ups under another interpreter). Not collected by
pytest; needs ``perf`` (Debian's ``linux-perf``) and a kernel that lets it sample other
processes (``kernel.perf_event_paranoid`` at 2 or less, or root). The targets, all started at once:
a bare relay (``tests.bench.relay``), the in-process store and Redis (with ``--against``, the
same from another checkout), each Redis set-up with a server of its own. After a warm-up replay
each (a fresh conversation every replay), every target's process and each Redis server is
sampled by the software clock (``cpu-clock``: no hardware counters needed, so it works in a VM)
while the targets take turns, replay by replay, for ``--rounds`` replays each (so the host's
drift hits them alike; a process waiting for its turn takes no samples), and each sample
counted as 1/frequency of a second.

Printed, in microseconds a request: the time by shared object (the interpreter, the kernel,
libc, aiohttp's parser, orjson, zstd...), the proxy's beside the relay's, so what the proxy
adds is read by part; with ``--top``, the symbols whose time differs most from the other
checkout's (or, alone, from the relay's), and the Redis servers' beside each other. For Redis
set-ups, the server's time by shared object and, from ``INFO commandstats`` over the same
replays, each command's calls a request (scripts' own calls included) and its microseconds,
which name what a script spends.

Why beside the deterministic counts (``tests.bench.opcodes``, ``instruction_count``): they
leave out the kernel (sockets, wake-ups, a worker thread's hand-offs) and what cache and
branch misses make of each instruction, and they run the proxy slowed down many times. This
bench measures the time itself, by part: a sampling profile, so a part under 2 % of a request
moves by its noise (each run prints its samples). Two identical set-ups in one run (the same
tree as ``--against``) read 0, +9 and +2 % apart in three runs of 6 replays: a difference
under 10 % needs several runs agreeing, and one of a few percent the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import redis.asyncio as aioredis

from tests.bench.instruction_count import add_replay_arguments, replay
from tests.bench.overhead import at_rest, metered_env, process
from tests.bench.request_forms import REQUEST_FORMS, RequestForm
from tests.processes import free_port, proxy_process, wait_until_ready
from tests.redis_server import RedisServer
from tests.transcripts import replay_requests, transcripts

SYMBOL_WIDTH = 70


@dataclass
class Profile:
    """One process's samples over the replays: microseconds a request by shared object and by
    (shared object, symbol)."""

    samples: int = 0
    by_object: dict[str, float] = field(default_factory=dict)
    by_symbol: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.by_object.values())


@dataclass
class Measured:
    name: str
    proxy: Profile
    redis: Profile | None = None
    commands: dict[str, tuple[float, float]] = field(default_factory=dict)  # calls, us


def report_rows(recording: Path) -> Iterator[tuple[int, str]]:
    """``perf report``'s rows by shared object and symbol: the samples, and the pair as
    ``<object> [.] <symbol>`` (``[k]`` for the kernel's)."""
    shown = subprocess.run(
        ["perf", "report", "-i", str(recording), "--stdio", "-q", "-n", "--sort", "dso,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in shown.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1].isdigit():
            yield int(parts[1]), " ".join(parts[2].split())


def profile_of(recording: Path, requests: int, frequency: int) -> Profile:
    each = 1e6 / frequency / requests  # a sample's microseconds, a request
    profile = Profile()
    for samples, key in report_rows(recording):
        profile.samples += samples
        profile.by_symbol[key] = samples * each
        shared = key.split(" [", 1)[0]
        profile.by_object[shared] = profile.by_object.get(shared, 0.0) + samples * each
    return profile


@contextlib.asynccontextmanager
async def sampled(pid: int, out: Path, frequency: int) -> AsyncIterator[None]:
    """``perf record`` on ``pid`` (all its threads) while the body runs (give it a second to
    attach before the body counts)."""
    recorder = await asyncio.create_subprocess_exec(
        *("perf", "record", "-q", "-e", "cpu-clock", "-F", str(frequency)),
        *("-o", str(out), "-p", str(pid)),
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        await recorder.wait()


@dataclass
class Target:
    """A process to sample, the base URL it serves, and for a Redis set-up its own server."""

    name: str
    pid: int
    base: str
    redis: RedisServer | None = None


async def measure(
    targets: list[Target], bodies: list[bytes], args: argparse.Namespace, work: Path
) -> list[Measured]:
    """Sample every target (and each Redis set-up's server) over ``--rounds`` replays each,
    taken in turns round by round, after a warm-up replay each."""
    form: RequestForm = REQUEST_FORMS[args.form]
    requests = args.rounds * len(bodies)
    servers = {t.name: aioredis.Redis.from_url(t.redis.url) for t in targets if t.redis}
    try:
        async with aiohttp.ClientSession() as http, contextlib.AsyncExitStack() as stack:
            for target in targets:
                await replay(http, target.base, bodies, form)
            await asyncio.sleep(1.0)  # the warm-ups' last records, written after their answers
            for target in targets:
                await stack.enter_async_context(
                    sampled(target.pid, work / f"{target.name}.perf", args.frequency)
                )
                if target.redis is not None and target.redis.process is not None:
                    await stack.enter_async_context(
                        sampled(
                            target.redis.process.pid,
                            work / f"{target.name}-redis.perf",
                            args.frequency,
                        )
                    )
            await asyncio.sleep(1.0)  # perf attaches to the threads before the replays start
            for server in servers.values():
                await server.config_resetstat()
            for _ in range(args.rounds):
                for target in targets:
                    await replay(http, target.base, bodies, form)
            await asyncio.sleep(1.0)
            stats = {name: await server.info("commandstats") for name, server in servers.items()}
    finally:
        for server in servers.values():
            await server.aclose()
    results = []
    for target in targets:
        measured = Measured(
            target.name, profile_of(work / f"{target.name}.perf", requests, args.frequency)
        )
        if target.redis is not None:
            recording = work / f"{target.name}-redis.perf"
            measured.redis = profile_of(recording, requests, args.frequency)
            for command, values in stats[target.name].items():
                name = command.removeprefix("cmdstat_")
                if name not in ("config|resetstat", "info"):
                    each = (values["calls"] / requests, values["usec"] / requests)
                    measured.commands[name] = each
        results.append(measured)
    return results


async def run(args: argparse.Namespace) -> None:
    chosen = next((t for t in transcripts() if args.transcript in t.name), transcripts()[0])
    form = REQUEST_FORMS[args.form]
    bodies = [orjson.dumps(form.body_of(history)) for history in replay_requests(chosen.messages)]
    print(
        f"transcript {chosen.name} as {args.form}: {len(bodies)} requests a replay, "
        f"{args.rounds} replays each, in turns, sampled at {args.frequency} Hz"
    )
    work = Path(tempfile.mkdtemp(prefix="cpu-profile-"))
    upstream_port, relay_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    fake = ("-m", "compaction_proxy.testing.fake_upstream", "--port", str(upstream_port))
    relayed = ("-m", "tests.bench.relay", "--port", str(relay_port), "--upstream", f"{upstream}/v1")
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(process(*fake, "--instant"))
            relay = await stack.enter_async_context(process(*relayed))
            relay_base = f"http://127.0.0.1:{relay_port}"
            for ready in (upstream, relay_base):
                await wait_until_ready(f"{ready}/v1/models")
            targets = [Target("relay", relay.pid, relay_base)]
            for suffix, checkout in {"": None, "@": args.against}.items():
                if suffix and checkout is None and args.against_python is None:
                    continue
                python = args.against_python if suffix else None
                for store in ("memory", "redis"):
                    server = None
                    if store == "redis":  # a server of its own: its samples and its counts
                        server = RedisServer()
                        await server.start()
                        stack.push_async_callback(server.stop)
                    url = "memory://" if server is None else server.url
                    env = {**metered_env(upstream), "COMPACTION_PROXY_STORE_URL": url}
                    proxy, base = await stack.enter_async_context(
                        proxy_process(env, cwd=checkout, python=python)
                    )
                    targets.append(Target(store + suffix, proxy.pid, base, server))
            await at_rest([t.pid for t in targets])
            results = await measure(targets, bodies, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_report(results, args)


def print_report(results: list[Measured], args: argparse.Namespace) -> None:
    print("\nCPU time a request, microseconds, by shared object (the samples taken: last row)")
    objects = sorted(
        {o for m in results for o in m.proxy.by_object},
        key=lambda o: -max(m.proxy.by_object.get(o, 0.0) for m in results),
    )[:10]
    print(f"{'':<42}" + "".join(f"{m.name:>10}" for m in results))
    for shared in objects:
        cells = "".join(f"{m.proxy.by_object.get(shared, 0.0):10.1f}" for m in results)
        print(f"{shared[:40]:<42}{cells}")
    print(f"{'all':<42}" + "".join(f"{m.proxy.total:10.1f}" for m in results))
    print(f"{'(samples)':<42}" + "".join(f"{m.proxy.samples:>10}" for m in results))
    for m in results:
        if m.redis is not None:
            parts = ", ".join(
                f"{o} {us:.1f}"
                for o, us in sorted(m.redis.by_object.items(), key=lambda kv: -kv[1])[:4]
            )
            print(f"\n{m.name}: the Redis server {m.redis.total:.1f} us a request ({parts})")
            print(f"  {'command':<18}{'calls':>8}{'us':>9}   (scripts' own calls included)")
            for command, (calls, us) in sorted(m.commands.items(), key=lambda kv: -kv[1][1]):
                if us >= 0.05:
                    print(f"  {command:<18}{calls:8.2f}{us:9.2f}")
    if args.top:
        by_name = {m.name: m for m in results}
        for name in ("memory", "redis"):
            other = by_name.get(f"{name}@") or by_name["relay"]
            differences(by_name[name].proxy, other.proxy, name, other.name, args.top)
        server, other_server = by_name["redis"].redis, by_name.get("redis@")
        if server is not None and other_server is not None and other_server.redis is not None:
            differences(server, other_server.redis, "redis's server", "redis@'s", args.top)


def differences(this: Profile, other: Profile, name: str, other_name: str, top: int) -> None:
    """The ``top`` symbols whose time a request differs most between two targets."""
    print(f"\n{name} against {other_name}: the symbols that differ most (us a request)")
    symbols = this.by_symbol.keys() | other.by_symbol.keys()

    def change(symbol: str) -> float:
        return this.by_symbol.get(symbol, 0.0) - other.by_symbol.get(symbol, 0.0)

    for symbol in sorted(symbols, key=lambda s: -abs(change(s)))[:top]:
        mine, theirs = this.by_symbol.get(symbol, 0.0), other.by_symbol.get(symbol, 0.0)
        print(f"  {mine:8.1f} {theirs:8.1f} {mine - theirs:+8.1f}  {symbol[:SYMBOL_WIDTH]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_replay_arguments(parser)
    parser.set_defaults(rounds=6)
    parser.add_argument("--top", type=int, default=0, help="the symbols that differ most")
    parser.add_argument("--frequency", type=int, default=4000, help="samples a second")
    parser.add_argument(
        "--against-python",
        metavar="PATH",
        help="another interpreter (a venv's python): memory@ and redis@ run under it",
    )
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (Debian: apt-get install linux-perf)")
    args.against = os.path.abspath(args.against) if args.against else None
    started = time.monotonic()
    asyncio.run(run(args))
    print(f"\n({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
