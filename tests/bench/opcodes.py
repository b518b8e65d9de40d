"""Bytecodes a request costs: the interpreter's work, which the instruction count hides.

Run: ``python -m tests.bench.opcodes [--against DIR] [--transcript NAME] [--rounds 2]
[--format chat|responses|messages] [--top N]``. Not collected by pytest.

Each set-up (the bare relay; the in-process store, Redis; with ``--against``, the same from
another checkout) runs under CPython's tracer (``tests.bench.opcode_proxy``); after a warm-up replay
(a fresh conversation each), the bytecodes executed over ``--rounds`` replays are counted and
divided by the requests sent: the proxy's own code, aiohttp's, redis-py's, the standard
library's, everything the interpreter ran for the requests (C code called from it, orjson's
and the hashing, counts nothing). With ``--top``, the functions whose counts differ most from
the other checkout's (matched by file and name, so a renamed module shows twice), with the
frames each entered a request (a call, or a coroutine's resumption); without ``--against``,
those that differ most from the bare relay's (``tests.bench.relay``, counted beside them):
what the proxy adds.

Why beside ``tests.bench.instruction_count``: an instruction in a C loop (a copy, a hash, a
JSON scan) costs a fraction of a cycle, one in the interpreter's loop several (its dispatch
is a branch the CPU often mispredicts). Two trees that ran the same instructions a request,
one trading C bulk work for Python work, differed by 15 % in CPU time; their bytecodes
differed by as much. A run takes about a minute and a half; two runs agree within 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from tests.bench.instruction_count import add_replay_arguments, replay
from tests.bench.overhead import at_rest, metered_env, process
from tests.bench.request_forms import REQUEST_FORMS, RequestForm
from tests.processes import free_port, stop, wait_until_ready
from tests.redis_server import RedisServer
from tests.transcripts import replay_requests, transcripts

WRAPPER = Path(__file__).with_name("opcode_proxy.py")


@dataclass(frozen=True)
class Counted:
    """One set-up's count over the replays: bytecodes by function, frames entered (in all
    and by function)."""

    opcodes: dict[str, int]
    frames: int
    entered: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.opcodes.values())


@dataclass(frozen=True)
class SetUp:
    """A process to count: the proxy on ``store`` from ``checkout``, or (``store`` None) the
    bare relay."""

    name: str
    checkout: str
    store: str | None


@contextlib.asynccontextmanager
async def traced_proxy(
    set_up: SetUp, upstream: str, out: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    port = free_port()
    env = {**os.environ, **metered_env(upstream), "BENCH_OPCODES": str(out)}
    arguments = ["serve", "--port", str(port)]
    if set_up.store is None:
        env["BENCH_OPCODES_MODULE"] = "tests.bench.relay"
        arguments = ["--port", str(port), "--upstream", f"{upstream}/v1"]
    else:
        env["COMPACTION_PROXY_STORE_URL"] = set_up.store
    proxy = await asyncio.create_subprocess_exec(
        sys.executable, str(WRAPPER), *arguments, env=env, cwd=set_up.checkout
    )
    try:
        yield proxy, f"http://127.0.0.1:{port}"
    finally:
        await stop(proxy)


async def count(
    proxy: asyncio.subprocess.Process,
    base: str,
    out: Path,
    bodies: list[bytes],
    rounds: int,
    form: RequestForm,
) -> Counted:
    async with aiohttp.ClientSession() as http:
        await replay(http, base, bodies, form)
        await asyncio.sleep(0.5)
        proxy.send_signal(signal.SIGTTIN)
        await asyncio.sleep(0.2)
        for _ in range(rounds):
            await replay(http, base, bodies, form)
        await asyncio.sleep(1.0)  # the last record, written after its answer
        proxy.send_signal(signal.SIGTTOU)
    report = orjson.loads(await asyncio.to_thread(written, out))
    return Counted(report["opcodes"], report["frames"], report["entered"])


def written(out: Path, timeout: float = 60.0) -> bytes:
    """The count, once the proxy has written it (whole: it is renamed into place)."""
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no count in {out}")
        time.sleep(0.2)
    return out.read_bytes()


async def run(
    against: str | None, transcript: str, rounds: int, form: RequestForm, top: int
) -> None:
    chosen = next((t for t in transcripts() if transcript in t.name), transcripts()[0])
    bodies = [orjson.dumps(form.body_of(history)) for history in replay_requests(chosen.messages)]
    requests = rounds * len(bodies)
    print(f"transcript {chosen.name} ({form.path}): {requests} requests counted")
    work = Path(tempfile.mkdtemp(prefix="opcodes-"))
    redis = RedisServer()
    await redis.start()
    set_ups = [SetUp("relay", os.getcwd(), None)]
    for suffix, checkout in {"": os.getcwd(), "@": against}.items():
        if checkout is not None:  # a Redis database of its own each
            set_ups.append(SetUp(f"memory{suffix}", checkout, "memory://"))
            set_ups.append(SetUp(f"redis{suffix}", checkout, f"{redis.url[:-2]}/{len(set_ups)}"))
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    fake = ("-m", "compaction_proxy.testing.fake_upstream", "--port", str(upstream_port))
    counted: dict[str, Counted] = {}
    try:
        async with process(*fake, "--instant"), contextlib.AsyncExitStack() as stack:
            await wait_until_ready(f"{upstream}/v1/models")  # before the relay asks it
            proxies = {}
            for set_up in set_ups:
                out = work / f"{set_up.name}.json"
                proxies[set_up.name] = (
                    await stack.enter_async_context(traced_proxy(set_up, upstream, out)),
                    out,
                )
            for name, ((_, base), _) in proxies.items():
                ready = "/v1/models" if name == "relay" else "/healthz"
                await wait_until_ready(f"{base}{ready}", timeout=120.0)
            await at_rest([proxy.pid for (proxy, _), _ in proxies.values()])
            for name, ((proxy, base), out) in proxies.items():
                counted[name] = await count(proxy, base, out, bodies, rounds, form)
                print(
                    f"{name:<10}{counted[name].total / requests:10.0f} bytecodes a request, "
                    f"{counted[name].frames / requests:6.0f} frames",
                    flush=True,
                )
    finally:
        await redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    if against is not None:
        for name in ("memory", "redis"):
            ratio = counted[name].total / counted[f"{name}@"].total
            print(f"{name}: x{ratio:.3f} the other checkout's")
            if top:
                differences(counted[name], counted[f"{name}@"], requests, top)
    elif top:
        for name in ("memory", "redis"):
            print(f"{name}: over the relay's")
            differences(counted[name], counted["relay"], requests, top)


def differences(this: Counted, other: Counted, requests: int, top: int) -> None:
    """The ``top`` functions whose bytecodes a request differ most between the checkouts."""
    names = this.opcodes.keys() | other.opcodes.keys()

    def change(name: str) -> int:
        return this.opcodes.get(name, 0) - other.opcodes.get(name, 0)

    print(f"  {'bytecodes a request':>26}  {'frames':>13}")
    for name in sorted(names, key=lambda n: -abs(change(n)))[:top]:
        mine, theirs = this.opcodes.get(name, 0) / requests, other.opcodes.get(name, 0) / requests
        frames = this.entered.get(name, 0) / requests, other.entered.get(name, 0) / requests
        print(
            f"  {mine:8.1f} {theirs:8.1f} {mine - theirs:+8.1f}"
            f"  {frames[0]:6.1f} {frames[1]:6.1f}  {name}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_replay_arguments(parser)
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        help="the functions that differ most from --against's (alone: from the relay's)",
    )
    args = parser.parse_args()
    against = os.path.abspath(args.against) if args.against else None
    asyncio.run(run(against, args.transcript, args.rounds, REQUEST_FORMS[args.form], args.top))


if __name__ == "__main__":
    main()
