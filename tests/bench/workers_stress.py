"""Start and stop ``serve --workers 2`` over and over: no hang, every worker up in time.

Run: ``python -m tests.bench.workers_stress [--cycles 200] [--parallel 2] [--against DIR]``
(``--against``: another checkout's package runs instead, for a side-by-side). Not collected by
pytest (``tests/system/test_workers_stress.py`` runs a few cycles of the same code). Each cycle
starts a supervisor with two workers on Redis, sends a request that takes a moment, and then,
in turn: SIGTERM to the supervisor, SIGINT to the supervisor, or SIGKILL to one worker
mid-request (the supervisor must start another), then SIGTERM. A supervisor that has not
exited ``EXIT_SECONDS`` after its signal is a hang: every process of it is asked for its
threads' stacks (SIGUSR1, ``faulthandler``), then killed, and its log is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.processes import alive, children_of, free_port
from tests.redis_server import RedisServer

KINDS = ("sigterm", "sigint", "kill-worker")
# A worker listens within this, at start and when replaced: its process starts and imports
# the package, which took up to 9 s on a loaded 2-core host (the suite's other test workers
# beside it). A worker that never listens is caught by the cycle's own 60 s bound: this one
# is for a start-up that got slow, not for a hang.
UP_SECONDS = 20.0
EXIT_SECONDS = 20.0  # past it, a supervisor that was told to stop hangs


@dataclass
class Cycle:
    kind: str
    up: float | None = None  # seconds from the supervisor's start-up line to both listening
    replaced: float | None = None  # seconds until a killed worker's replacement listened
    exited: float | None = None  # seconds from the stop signal to the supervisor's exit
    answered: bool = False  # the request in flight at the signal was answered
    problems: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


async def _log_until(cycle: Cycle, needle: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(needle in line for line in cycle.log):
            return True
        await asyncio.sleep(0.02)
    return False


async def one_cycle(
    kind: str, upstream: FakeUpstream, upstream_url: str, redis_url: str, cwd: str | None
) -> Cycle:
    cycle = Cycle(kind)
    port = free_port()
    env = {
        **os.environ,
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "REDIS_URL": redis_url,
    }
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "compaction_proxy", "serve", "--workers", "2", "--port", str(port)),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,  # ``-m`` puts it first on the path: that checkout's package runs
    )

    async def read_log() -> None:
        assert supervisor.stderr is not None
        async for line in supervisor.stderr:
            cycle.log.append(line.decode(errors="replace").rstrip())

    reader = asyncio.create_task(read_log())
    try:
        if not await _log_until(cycle, "compaction-proxy ", 60):
            cycle.problems.append("the supervisor did not start within 60 s")
            return cycle
        started = time.monotonic()  # its settings read: the workers start now
        if not await _log_until(cycle, "2 workers listening", 60):
            cycle.problems.append("the workers did not both listen within 60 s")
            return cycle
        cycle.up = time.monotonic() - started
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            in_flight = await _in_flight(cycle, http, base, upstream)
            if kind == "kill-worker":
                victim = min(children_of(supervisor.pid))
                killed = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                if await _log_until(cycle, f"in place of {victim}", UP_SECONDS * 2):
                    cycle.replaced = time.monotonic() - killed
                else:
                    cycle.problems.append(f"worker {victim} was not replaced")
                with contextlib.suppress(aiohttp.ClientError):
                    await in_flight  # it may have been on the killed worker
                in_flight = await _in_flight(cycle, http, base, upstream)
            sent = signal.SIGINT if kind == "sigint" else signal.SIGTERM
            stopping = time.monotonic()
            workers = children_of(supervisor.pid)
            supervisor.send_signal(sent)
            try:
                cycle.answered = await in_flight
            except aiohttp.ClientError as error:
                cycle.problems.append(f"the request in flight at the signal failed: {error!r}")
            try:
                await asyncio.wait_for(supervisor.wait(), EXIT_SECONDS)
                cycle.exited = time.monotonic() - stopping
            except TimeoutError:
                cycle.problems.append(f"hang: not exited {EXIT_SECONDS:.0f} s after {sent.name}")
                await _stacks_then_kill(supervisor.pid, workers)
            left = [pid for pid in workers if alive(pid)]
            if left:
                cycle.problems.append(f"workers outlived their supervisor: {left}")
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        return cycle
    finally:
        if supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, 5)


async def _in_flight(
    cycle: Cycle, http: aiohttp.ClientSession, base: str, upstream: FakeUpstream
) -> asyncio.Task[bool]:
    """A request sent, once a worker has forwarded it (it waits on the upstream's answer): a
    fixed pause could end, on a loaded host, before any worker had read it, and a stop then
    closes a connection that holds no request yet (as it should)."""
    reached = len(upstream.received) + 1
    asked = asyncio.create_task(_ask(http, base))
    deadline = time.monotonic() + UP_SECONDS
    while len(upstream.received) < reached and not asked.done():
        if time.monotonic() > deadline:
            cycle.problems.append(f"a request did not reach the upstream in {UP_SECONDS:.0f} s")
            break
        await asyncio.sleep(0.01)
    return asked


async def _ask(http: aiohttp.ClientSession, base: str) -> bool:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": "Bearer k"}
    async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as reply:
        return reply.status == 200


async def _stacks_then_kill(supervisor: int, workers: set[int]) -> None:
    for pid in (supervisor, *workers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(1.0)
    for pid in (supervisor, *workers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def stress_setup() -> AsyncIterator[tuple[FakeUpstream, str, str]]:
    """A fake upstream whose answers take a moment (its URL), and a Redis of its own."""
    fake = FakeUpstream()
    fake.response_delay = 0.5
    runner = web.AppRunner(fake.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    redis = RedisServer()
    await redis.start()
    try:
        yield fake, f"http://127.0.0.1:{port}/v1", redis.url
    finally:
        await redis.stop()
        await runner.cleanup()


async def run_cycles(cycles: int, parallel: int, cwd: str | None = None) -> list[Cycle]:
    async with stress_setup() as (upstream, upstream_url, redis_url):
        gate = asyncio.Semaphore(parallel)

        async def gated(index: int) -> Cycle:
            async with gate:
                kind = KINDS[index % len(KINDS)]
                return await one_cycle(kind, upstream, upstream_url, redis_url, cwd)

        return await asyncio.gather(*(gated(i) for i in range(cycles)))


def summary(results: list[Cycle]) -> list[str]:
    def slowest(values: list[float | None]) -> str:
        seen = [v for v in values if v is not None]
        return f"{max(seen):.2f} s" if seen else "-"

    hangs = sum(any(p.startswith("hang") for p in c.problems) for c in results)
    kinds = ", ".join(f"{k} {sum(c.kind == k for c in results)}" for k in KINDS)
    lines = [
        f"{len(results)} cycles ({kinds}): {hangs} hangs,"
        f" {sum(bool(c.problems) for c in results)} with a problem",
        "both workers listening after the supervisor's start-up line: slowest"
        f" {slowest([c.up for c in results])};"
        f" a killed worker replaced: slowest {slowest([c.replaced for c in results])};"
        f" exit after the signal: slowest {slowest([c.exited for c in results])}",
        f"requests in flight at the signal answered: {sum(c.answered for c in results)}"
        f" of {len(results)}",
    ]
    for cycle in results:
        for problem in cycle.problems:
            lines.append(f"  {cycle.kind}: {problem}")
            lines.extend(f"    | {line}" for line in cycle.log[-40:])
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--against", help="another checkout whose package to run")
    args = parser.parse_args()
    started = time.monotonic()
    results = asyncio.run(run_cycles(args.cycles, args.parallel, args.against))
    for line in summary(results):
        print(line)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
