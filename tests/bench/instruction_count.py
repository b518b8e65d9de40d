"""Instructions a request costs, counted by valgrind: a measure the host's noise cannot move.

Run: ``python -m tests.bench.instruction_count [--against DIR] [--transcript NAME] [--rounds 2]
[--format chat|responses|messages]``.
Not collected by pytest; needs ``valgrind`` (Debian's package). Each set-up (the in-process
store, Redis; with ``--against``, the same from another checkout) runs as ``serve`` under
callgrind with instrumentation off, so it starts and imports litellm at about native speed.
After a settling pause and one warm-up replay (a fresh conversation each), instrumentation is
switched on for ``--rounds`` replays and the counts dumped: every thread of the process,
compression and the event loop included, divided by the requests sent. The Redis server runs
under callgrind too: its counts over the same replays (its scripts, the packs the proxy lands
after them) are the Redis set-up's other part, which the proxy's own count leaves out.

Side by side, the overhead bench (``tests.bench.overhead``) cannot tell a change of 2 or 3 %
from this host's noise; two counts of one checkout agree within 0.2 %. The count is not the
time: a copy of a big body by ``rep movsb`` counts each byte, and cache misses count nothing,
so compare checkouts by it and size deployments by the overhead bench. ``--caches`` adds
callgrind's cache simulation (slower): the first- and last-level misses a request, the last
level sized as this host's per-core second level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from tests.bench.overhead import metered_env
from tests.bench.request_forms import CHAT, REQUEST_FORMS, RequestForm
from tests.processes import free_port, serve_argv, wait_until_ready
from tests.redis_server import RedisServer
from tests.transcripts import replay_requests, transcripts

SETTLE_SECONDS = 45.0  # litellm's background import ends well within it under valgrind


async def replay(
    http: aiohttp.ClientSession, base: str, bodies: list[bytes], form: RequestForm = CHAT
) -> None:
    headers = form.headers(f"count-{time.time_ns()}")
    for body in bodies:
        async with http.post(f"{base}{form.path}", data=body, headers=headers) as answer:
            await answer.read()
            assert answer.status == 200, answer.status


def counted(out: Path, dump: int = 1) -> int:
    """Instructions in a dump: callgrind numbers the dumps asked for ``<out>.1``, ``.2``..."""
    return events_counted(out, dump)["Ir"]


def events_counted(out: Path, dump: int = 1) -> dict[str, int]:
    """Every event a dump counted, by callgrind's name: ``Ir`` (instructions) and, with its
    cache simulation, ``I1mr D1mr D1mw`` (first-level misses) and ``ILmr DLmr DLmw`` (last
    level's)."""
    names: list[str] = []
    for line in out.with_name(f"{out.name}.{dump}").read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        if line.startswith(("totals:", "summary:")):
            return dict(zip(names, map(int, line.split()[1:]), strict=False))
    raise ValueError(f"no totals in {out}.{dump}")


def simulated_caches() -> list[str]:
    """callgrind's cache simulation, its last level sized as this host's second (per core: a
    big body evicts from it what the next request's Python work needs; the shared third
    level hides that)."""
    index = Path("/sys/devices/system/cpu/cpu0/cache/index2")
    try:
        size, ways, line = (
            (index / name).read_text().strip()
            for name in ("size", "ways_of_associativity", "coherency_line_size")
        )
    except OSError:
        return ["--cache-sim=yes"]
    scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1:], 1)
    size_bytes = int(size.rstrip("KM")) * scale
    return ["--cache-sim=yes", f"--LL={size_bytes},{ways},{line}"]


class CountedRedis:
    """The shared Redis server under callgrind: its counts zeroed before a set-up's replays
    and dumped after them."""

    def __init__(self, work: Path) -> None:
        self.out = work / "redis-callgrind"
        wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}")
        self.server = RedisServer(wrapper=wrapper, start_seconds=120.0)
        self.dumps = 0

    async def zero(self) -> None:
        assert self.server.process is not None
        await control("-z", self.server.process.pid)

    async def dump(self) -> int:
        """The instructions since ``zero``."""
        assert self.server.process is not None
        await control("-d", self.server.process.pid)
        self.dumps += 1
        return counted(self.out, self.dumps)


async def count(
    upstream: str,
    store: str,
    cwd: str | None,
    bodies: list[bytes],
    rounds: int,
    work: Path,
    form: RequestForm,
    redis: CountedRedis | None = None,
    caches: bool = False,
) -> tuple[dict[str, float], float | None]:
    """Millions of instructions a request for one set-up (and each simulated cache's misses,
    with ``caches``): the proxy's, and with ``redis`` the Redis server's over the same
    replays."""
    port, out = free_port(), work / f"callgrind-{time.time_ns()}"
    env = {**os.environ, **metered_env(upstream), "COMPACTION_PROXY_STORE_URL": store}
    process = await asyncio.create_subprocess_exec(
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        *(simulated_caches() if caches else ()),
        *serve_argv(port),
        env=env,
        cwd=cwd,
        stderr=asyncio.subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    served = None
    try:
        await wait_until_ready(f"{base}/healthz", timeout=300.0)
        await asyncio.sleep(SETTLE_SECONDS)
        async with aiohttp.ClientSession() as http:
            await replay(http, base, bodies, form)
            await asyncio.sleep(1.0)
            if redis is not None:
                await redis.zero()
            await control("-i", "on", process.pid)
            for _ in range(rounds):
                await replay(http, base, bodies, form)
            await asyncio.sleep(1.0)  # the last record, written after its answer
            await control("-d", process.pid)
            served = await redis.dump() if redis is not None else None
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await process.wait()
    requests = rounds * len(bodies)
    each = {name: n / requests / 1e6 for name, n in events_counted(out).items()}
    return each, None if served is None else served / requests / 1e6


async def control(*args: str | int) -> None:
    done = await asyncio.create_subprocess_exec(
        "callgrind_control",
        *map(str, args),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await done.wait()


async def run(
    against: str | None, transcript: str | None, rounds: int, form: str, caches: bool = False
) -> None:
    every = transcripts()
    chosen = next((t for t in every if transcript and transcript in t.name), every[0])
    bodies = [
        orjson.dumps(REQUEST_FORMS[form].body_of(history))
        for history in replay_requests(chosen.messages)
    ]
    print(
        f"transcript {chosen.name} as {form}: {len(bodies)} requests a replay, "
        f"{rounds} replays counted"
    )
    upstream_port = free_port()
    upstream = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "compaction_proxy.testing.fake_upstream",
        "--port",
        str(upstream_port),
        "--instant",
        stdout=asyncio.subprocess.DEVNULL,
    )
    work = Path(tempfile.mkdtemp(prefix="instruction-count-"))
    redis = CountedRedis(work)
    await redis.server.start()
    try:
        upstream_url = f"http://127.0.0.1:{upstream_port}"
        checkouts = {"": None} | ({"@": against} if against else {})
        database = 0
        for suffix, cwd in checkouts.items():
            for name in ("memory", "redis"):
                database += 1
                url = redis.server.url
                store = "memory://" if name == "memory" else f"{url[:-2]}/{database}"
                counted_redis = None if name == "memory" else redis
                millions, served = await count(
                    upstream_url,
                    store,
                    cwd,
                    bodies,
                    rounds,
                    work,
                    REQUEST_FORMS[form],
                    counted_redis,
                    caches,
                )
                server = "" if served is None else f", the Redis server {served:.3f} M"
                missed = ""
                if caches:
                    first = sum(millions.get(e, 0.0) for e in ("I1mr", "D1mr", "D1mw")) * 1e3
                    last = sum(millions.get(e, 0.0) for e in ("ILmr", "DLmr", "DLmw")) * 1e3
                    missed = f"; misses a request: {first:.1f} k first level, {last:.2f} k last"
                print(
                    f"{name + suffix:<10}{millions['Ir']:8.3f} M instructions a request"
                    f"{server}{missed}",
                    flush=True,
                )
    finally:
        await redis.server.stop()
        upstream.terminate()
        await upstream.wait()
        shutil.rmtree(work, ignore_errors=True)


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a bench that counts replays of a transcript, beside another checkout."""
    parser.add_argument("--against", help="another checkout, counted beside this one")
    parser.add_argument("--transcript", default="13265", help="part of a transcript's name")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--format", choices=sorted(REQUEST_FORMS), default="chat", dest="form")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_replay_arguments(parser)
    parser.add_argument(
        "--caches",
        action="store_true",
        help="simulate the caches too (slower): misses a request, first and last level",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    asyncio.run(run(args.against, args.transcript, args.rounds, args.form, args.caches))


if __name__ == "__main__":
    main()
