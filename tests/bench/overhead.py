"""Proxy overhead, side by side in one run: direct, a bare relay, and the proxy in three set-ups.

Run: ``python -m tests.bench.overhead [--rounds N] [--transcript NAME] [--against DIR]
[--against-python PATH] [--format chat|responses|messages]``. Not collected by pytest.
``--format``: the transcript's requests as that wire format's agents send them
(``tests.bench.request_forms``), to every target alike, so a format's overhead is read
against a relay of the same bodies. With ``--against``, the memory and Redis set-ups of
another checkout (a worktree of the parent commit) run as ``memory@`` and ``redis@`` beside
this one's, in the same rounds: a change on the request path is measured against its
parent, not against noise. With ``--against-python``, those set-ups run under another
interpreter (a venv's ``python``, holding the dependencies), from this checkout unless
``--against`` names another: one Python release measured against another.
The fake upstream answers instantly (no token counting), so what differs between the
columns is the hop in the middle. Targets are interleaved round by round so that noise on a
shared machine hits all of them alike, and every round replays the transcript as a fresh
conversation (its own ``X-Session-Id``), so the proxy sees append-only growth as from a real
agent, never a history it already logged.

Printed, for concurrency 1 and 4: req/s, p50 and p99 per target and as ratios to the relay;
the CPU time each proxy set-up spent per request (its processes, and Redis's apart), which is
what sizing follows from; then the cost per request against history length: the proxy's
median extra over the relay in the last tenth of the transcript, divided by the same in the
first tenth, from replays run in step (request by request across the targets, so that the two
requests compared were served moments apart), in latency and in CPU time. The same ratios are
printed for a control: the relay plus a fixed amount of Python work per request. In that phase
the memory set-up times its own work as well (``tests.bench.stage_proxy``): the thread CPU of
each request's parse, preparation and record, by position, with nothing subtracted, which says
directly whether the work per request grows with the history. Each phase also prints the share
of the host's CPU time the hypervisor took (steal): a run whose phases lost much of it measured
the neighbours as well.

The latency ratio is the user's view but a coarse instrument on a small host: a difference of
a few hundred microseconds between two latencies, each shaped by how three processes on two
cores happen to overlap with a bigger body (the control, whose work cannot grow, measured from
x0.94 to x2.55 on one host in one hour). The CPU ratio counts what each set-up's processes ran
(Linux schedstat, nanoseconds) from one request to its next, its work after the answer
included, with Redis's own for a Redis set-up: free of the overlaps, not of the caches. Fixed
work still costs more after a big body has passed through the CPU's caches, and the control's
CPU ratio (x0.74 to x1.58 on that host) is the floor it sets in that run: a proxy at or under
the control's ratio grows no more than fixed work does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson

from compaction_proxy.security.client_keys import digest_of
from tests.bench.request_forms import CHAT, REQUEST_FORMS, RequestForm
from tests.bench.stage_proxy import STAGE_NAMES
from tests.processes import free_port, proxy_process, wait_until_ready
from tests.redis_server import RedisServer
from tests.transcripts import replay_requests, transcripts

CONCURRENCIES = (1, 4)
_fresh = itertools.count()


@asynccontextmanager
async def process(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(sys.executable, *args)
    try:
        yield proc
    finally:
        proc.terminate()
        await proc.wait()


async def post(
    http: aiohttp.ClientSession, base: str, body: bytes, session: str, form: RequestForm = CHAT
) -> float:
    """One request of a replay; its latency."""
    started = time.perf_counter()
    async with http.post(f"{base}{form.path}", data=body, headers=form.headers(session)) as answer:
        await answer.read()
        assert answer.status == 200, answer.status
    return time.perf_counter() - started


async def replay(
    http: aiohttp.ClientSession,
    base: str,
    bodies: list[bytes],
    concurrency: int,
    form: RequestForm = CHAT,
) -> tuple[list[list[float]], float]:
    """Send every body (``concurrency`` replays at once, each a fresh conversation); the
    latencies of each replay by request index, and the wall time."""
    replays: list[list[float]] = []

    async def one_replay() -> None:
        session = f"bench-{next(_fresh)}"
        replays.append([await post(http, base, body, session, form) for body in bodies])

    started = time.perf_counter()
    await asyncio.gather(*(one_replay() for _ in range(concurrency)))
    return replays, time.perf_counter() - started


@dataclass
class Stepped:
    """One target's replays in step: per round, the latency and the CPU time (ns, its own
    processes plus Redis's for a Redis set-up) of each request by index."""

    latencies: list[list[float]] = field(default_factory=list)
    cpu_ns: list[list[int]] = field(default_factory=list)


def rotated(bases: dict[str, str], turn: int) -> list[tuple[str, str]]:
    """The targets in their order, started ``turn`` places further along: no target always
    comes right after the same other one (or first, after the client's pause)."""
    items = list(bases.items())
    shift = turn % len(items)
    return items[shift:] + items[:shift]


async def lockstep(
    http: aiohttp.ClientSession,
    bases: dict[str, str],
    pids: dict[str, list[int]],
    bodies: list[bytes],
    rounds: int,
    form: RequestForm = CHAT,
) -> dict[str, Stepped]:
    """Every target replays the transcript in step, one request each in turn (a fresh
    conversation per target and round), so the latencies compared at one request index were
    measured moments apart: noise from the rest of the machine, which comes and goes over
    seconds, then hits the targets alike instead of one replay.

    A request's CPU time is what the target's processes (``pids``) ran from just before it
    was sent to just before the target's next request: work a proxy does after its answer
    (the log record) is counted with the request that caused it, and the other targets'
    requests in between cost it nothing."""
    stepped = {name: Stepped() for name in bases}
    for turn in range(rounds):
        sessions = {name: f"bench-{next(_fresh)}" for name in bases}
        latencies: dict[str, list[float]] = {name: [] for name in bases}
        marks: dict[str, list[int]] = {name: [] for name in bases}
        order = rotated(bases, turn)
        for body in bodies:
            for name, base in order:
                marks[name].append(run_ns(pids[name]))
                latencies[name].append(await post(http, base, body, sessions[name], form))
        await asyncio.sleep(0.05)  # the last records
        for name in bases:
            marks[name].append(run_ns(pids[name]))
            ticks = marks[name]
            stepped[name].cpu_ns.append([b - a for a, b in itertools.pairwise(ticks)])
            stepped[name].latencies.append(latencies[name])
    return stepped


def run_ns(pids: list[int]) -> int:
    """Nanoseconds every thread of the processes ``pids`` has run (Linux schedstat: exact,
    where clock ticks put a request of a millisecond between two of them)."""
    total = 0
    for pid in pids:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{pid}/task/{thread}/schedstat", "rb") as stat:
                    total += int(stat.read().split(maxsplit=1)[0])
            except OSError:
                continue  # a thread gone meanwhile
    return total


def cpu_jiffies() -> tuple[int, int]:
    """The host's CPU time stolen by the hypervisor, and its CPU time in all, so far (Linux
    /proc/stat, in clock ticks)."""
    with open("/proc/stat", "rb") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    return fields[7], sum(fields)


def stolen_since(before: tuple[int, int]) -> str:
    """The share of CPU time stolen since ``before`` (``cpu_jiffies()``), for a report line."""
    steal, total = cpu_jiffies()
    share = (steal - before[0]) / max(1, total - before[1])
    return f"host CPU time stolen by the hypervisor meanwhile: {share:.0%}"


def cpu_seconds(root: int) -> float:
    """CPU time of process ``root`` and all its descendants: every live thread's scheduler run
    time (Linux schedstat, exact to the nanosecond; a thread that ended meanwhile is not
    counted, and the proxies end none while serving). Clock ticks (``utime``, ``stime``, 100 a
    second) put a round of 150 requests of a millisecond at about 15 ticks: one tick either way
    is 6 % of it."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children[int(fields[1])].append(int(entry))  # fields[1] is the parent's pid
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return run_ns(tree) / 1e9


async def at_rest(pids: list[int], timeout: float = 120.0) -> None:
    """Wait until the processes (and their descendants) spend under 5 % of a core for a whole
    second. A proxy listens before litellm has loaded (a thread imports it for seconds, longer
    while several proxies start at once on a small host); measured meanwhile, the import's CPU
    time would count as the proxy's and its work would slow the first rounds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(map(cpu_seconds, pids))
        await asyncio.sleep(1.0)
        if sum(map(cpu_seconds, pids)) - before < 0.05:
            return
    raise TimeoutError("the targets did not come to rest")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def growth_ratio(
    proxy: Sequence[Sequence[float]], relay: Sequence[Sequence[float]], scale: float = 1000.0
) -> tuple[float, float, float]:
    """Median extra over the relay in the first and last tenth of the transcript (latencies
    in seconds or CPU times in ns, printed in ms: ``scale`` converts), and last over first.
    Per request index, the median over rounds of each side."""
    count = len(proxy[0])
    extra = [
        statistics.median(r[i] for r in proxy) - statistics.median(r[i] for r in relay)
        for i in range(count)
    ]
    tenth = max(1, count // 10)
    first = statistics.median(extra[:tenth]) * scale
    last = statistics.median(extra[-tenth:]) * scale
    return first, last, last / first if first > 0 else float("inf")


def own_work_growth(path: str, count: int) -> dict[str, tuple[float, float, float]]:
    """From a timed proxy's lines (``tests.bench.stage_proxy``), per stage and in all: the
    median CPU time (ms) of a request in the first and the last tenth of the transcript
    (``count`` requests, a request's position being its body's length), and last over first.
    Per position, the median over rounds."""
    by_length: dict[int, list[list[int]]] = defaultdict(list)
    with open(path) as lines:
        for line in lines:
            length, _generation, *spent = map(int, line.split())
            by_length[length].append([*spent, sum(spent)])
    positions = sorted(by_length)[-count:]  # the replays' requests (a warm-up may add more)
    tenth = max(1, len(positions) // 10)
    growth = {}
    for column, name in enumerate((*STAGE_NAMES, "all")):
        medians = [statistics.median(row[column] for row in by_length[p]) for p in positions]
        first = statistics.median(medians[:tenth]) / 1e6
        last = statistics.median(medians[-tenth:]) / 1e6
        growth[name] = (first, last, last / first if first > 0 else float("inf"))
    return growth


def metered_env(upstream: str, held_key: bool = False) -> dict[str, str]:
    """A proxy's environment for ``upstream``: a window so large that nothing is compacted,
    yet every request is metered against it, as with a configured route. ``held_key``: the
    route holds the upstream key and the requests' ``bench`` is a client key of the proxy's
    (a shared gateway: every body is searched for the stored objects it names). It logs
    warnings only, unless ``COMPACTION_PROXY_LOG_LEVEL`` is set (say ``INFO``, the default's
    access lines)."""
    route: dict[str, object] = {
        "model": "*",
        "base_url": f"{upstream}/v1",
        "context_window": 10_000_000,
    }
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": f"{upstream}/v1",
        "COMPACTION_PROXY_TENANT_SECRET": "bench",
        # Quiet unless asked (the default, INFO, writes an access line a request).
        "COMPACTION_PROXY_LOG_LEVEL": os.environ.get("COMPACTION_PROXY_LOG_LEVEL", "WARNING"),
    }
    if held_key:
        route["api_key_env"] = "BENCH_UPSTREAM_KEY"
        env["BENCH_UPSTREAM_KEY"] = "sk-bench-held"
        env["COMPACTION_PROXY_UPSTREAM_API_KEY_ENV"] = "BENCH_UPSTREAM_KEY"
        env["COMPACTION_PROXY_CLIENT_KEY_DIGESTS"] = orjson.dumps([digest_of("bench")]).decode()
    env["COMPACTION_PROXY_ROUTES"] = orjson.dumps([route]).decode()
    return env


@dataclass(frozen=True)
class StepTargets:
    """The targets only the phase in step uses: the control (a relay that runs fixed work per
    request) and a memory proxy timing its own work into the file ``timings``."""

    control: str
    timed: str
    timed_pid: int
    timings: str


@asynccontextmanager
async def targets(
    upstream_port: int,
    control_us: float,
    timings: str,
    against: str | None = None,
    held_key: bool = False,
    against_python: str | None = None,
) -> AsyncIterator[tuple[dict[str, str], dict[str, int], StepTargets]]:
    """Every target's base URL, the upstream included, and the process ids whose CPU time is
    a set-up's ("redis-server" for the Redis server, "control" for the control); then the
    targets of the phase in step (the control runs ``control_us`` of fixed work per request;
    the timed proxy writes to ``timings``). All stopped on exit."""
    upstream = f"http://127.0.0.1:{upstream_port}"
    relay_port, control_port = free_port(), free_port()
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
        relay = await stack.enter_async_context(
            process(
                "-m", "tests.bench.relay", "--port", str(relay_port), "--upstream", f"{upstream}/v1"
            )
        )
        control_process = await stack.enter_async_context(
            process(
                "-m",
                "tests.bench.relay",
                "--port",
                str(control_port),
                "--upstream",
                f"{upstream}/v1",
                "--work-us",
                str(control_us),
            )
        )
        control = f"http://127.0.0.1:{control_port}"
        redis_server = RedisServer()
        await redis_server.start()
        stack.push_async_callback(redis_server.stop)
        assert redis_server.process is not None
        pids = {
            "redis-server": redis_server.process.pid,
            "relay": relay.pid,
            "control": control_process.pid,
        }
        env = metered_env(upstream, held_key)
        bases = {"direct": upstream, "relay": f"http://127.0.0.1:{relay_port}"}
        for name, store, args in (
            ("memory", "memory://", ()),
            ("redis", f"{redis_server.url[:-2]}/1", ()),
            ("redis x2", f"{redis_server.url[:-2]}/2", ("--workers", "2")),
        ):
            proxy, base = await stack.enter_async_context(
                proxy_process({**env, "COMPACTION_PROXY_STORE_URL": store}, *args)
            )
            bases[name] = base
            pids[name] = proxy.pid
        if against is not None or against_python is not None:
            # The same set-ups, run from the other checkout or under the other interpreter.
            for name, store in (("memory@", "memory://"), ("redis@", f"{redis_server.url[:-2]}/3")):
                other_env = {**env, "COMPACTION_PROXY_STORE_URL": store}
                proxy, base = await stack.enter_async_context(
                    proxy_process(other_env, cwd=against, python=against_python)
                )
                bases[name] = base
                pids[name] = proxy.pid
        timed_env = {**env, "COMPACTION_PROXY_STORE_URL": "memory://", "BENCH_TIMINGS": timings}
        timed, timed_base = await stack.enter_async_context(
            proxy_process(timed_env, module="tests.bench.stage_proxy")
        )
        pids["memory (timed)"] = timed.pid
        relays = (bases["direct"], bases["relay"], control)
        for base in (*bases.values(), control, timed_base):
            # A proxy holding a key answers /v1/ only to client keys: its health, then.
            probe = "/healthz" if held_key and base not in relays else "/v1/models"
            await wait_until_ready(f"{base}{probe}")
        yield bases, pids, StepTargets(control, timed_base, timed.pid, timings)


@dataclass
class Tally:
    """One target's figures at one concurrency, over every round."""

    replays: list[list[float]] = field(default_factory=list)  # latencies by request index
    rps: list[float] = field(default_factory=list)
    requests: int = 0
    cpu: float = 0.0  # CPU seconds of the target's own processes
    redis_cpu: float = 0.0  # CPU seconds of the Redis server meanwhile

    @property
    def latencies(self) -> list[float]:
        return [x for one in self.replays for x in one]


async def run(
    rounds: int,
    step_rounds: int,
    control_us: float,
    transcript: str | None,
    against: str | None = None,
    held_key: bool = False,
    form: RequestForm = CHAT,
    against_python: str | None = None,
) -> None:
    every = transcripts()
    chosen = next((t for t in every if transcript and transcript in t.name), every[0])
    bodies = [orjson.dumps(form.body_of(history)) for history in replay_requests(chosen.messages)]
    size = statistics.mean(len(b) for b in bodies)
    print(
        f"transcript {chosen.name} ({form.path}): {len(bodies)} requests per replay, mean body "
        f"{size / 1024:.0f} KiB, {rounds} rounds, a fresh conversation per replay"
    )
    timings = tempfile.NamedTemporaryFile(prefix="bench-timings-", delete=False)  # noqa: SIM115
    timings.close()
    try:
        await measure(
            bodies,
            rounds,
            step_rounds,
            control_us,
            timings.name,
            against,
            held_key,
            form,
            against_python,
        )
    finally:
        os.unlink(timings.name)


async def measure(
    bodies: list[bytes],
    rounds: int,
    step_rounds: int,
    control_us: float,
    timings: str,
    against: str | None = None,
    held_key: bool = False,
    form: RequestForm = CHAT,
    against_python: str | None = None,
) -> None:
    async with targets(free_port(), control_us, timings, against, held_key, against_python) as (
        bases,
        pids,
        step,
    ):
        await at_rest(list(pids.values()))
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as http:
            for base in bases.values():
                await replay(http, base, bodies, 1, form)  # warm-up
            for concurrency in CONCURRENCIES:
                tallies: dict[str, Tally] = defaultdict(Tally)
                jiffies = cpu_jiffies()
                for turn in range(rounds):
                    for name, base in rotated(bases, turn):
                        tally = tallies[name]
                        own, redis = pids.get(name), pids["redis-server"]
                        before = (cpu_seconds(own) if own else 0.0), cpu_seconds(redis)
                        done, wall = await replay(http, base, bodies, concurrency, form)
                        tally.cpu += (cpu_seconds(own) if own else 0.0) - before[0]
                        tally.redis_cpu += cpu_seconds(redis) - before[1]
                        tally.replays.extend(done)
                        tally.requests += sum(map(len, done))
                        tally.rps.append(sum(map(len, done)) / wall)
                report(concurrency, tallies)
                print(stolen_since(jiffies))
            if step_rounds == 0:
                return
            print(
                f"\ncost against history length (the targets in step, concurrency 1, "
                f"{step_rounds} rounds)"
            )
            await replay(http, step.timed, bodies, 1, form)  # warm-up
            os.truncate(step.timings, 0)  # not counted (the proxy appends after the end)
            stepped_bases = {name: bases[name] for name in ("relay", "redis")}
            stepped_bases.update(memory=step.timed, control=step.control)
            stepped_pids = {name: [pids[name]] for name in ("relay", "redis", "control")}
            stepped_pids["memory"] = [step.timed_pid]
            stepped_pids["redis"].append(pids["redis-server"])
            jiffies = cpu_jiffies()
            stepped = await lockstep(http, stepped_bases, stepped_pids, bodies, step_rounds, form)
            relay = stepped["relay"]
            for name in ("memory", "redis", "control"):
                first, last, ratio = growth_ratio(stepped[name].latencies, relay.latencies)
                cpu_first, cpu_last, cpu_ratio = growth_ratio(
                    stepped[name].cpu_ns, relay.cpu_ns, scale=1e-6
                )
                print(
                    f"{name:<8} extra over relay, first tenth / last tenth: latency "
                    f"{first:.2f} / {last:.2f} ms x{ratio:.2f}; CPU {cpu_first:.2f} / "
                    f"{cpu_last:.2f} ms x{cpu_ratio:.2f}"
                )
            print(
                f"(control: the relay plus {control_us:.0f} us of fixed Python work per "
                "request; its growth is what work that does not grow with the body shows on "
                "this host. CPU: the set-up's processes, Redis's included, from one request "
                "to its next, so what a proxy does after its answer counts)"
            )
            print("memory's own work per request (thread CPU, in place), first / last tenth:")
            for name, (first, last, ratio) in own_work_growth(step.timings, len(bodies)).items():
                print(f"  {name:<8} {first:.3f} / {last:.3f} ms x{ratio:.2f}")
            print(stolen_since(jiffies))


def report(concurrency: int, tallies: dict[str, Tally]) -> None:
    print(f"\nconcurrency {concurrency}")
    header = f"{'target':<10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'req/s / relay':>15}"
    print(f"{header}{'CPU ms/req':>12}{'Redis ms/req':>14}")
    relay_rps = statistics.median(tallies["relay"].rps)
    for name, tally in tallies.items():
        latencies, median_rps = tally.latencies, statistics.median(tally.rps)
        cpu_columns = ""
        if name != "direct":
            cpu_columns = f"{tally.cpu / tally.requests * 1000:>12.2f}"
            if name.startswith("redis"):
                cpu_columns += f"{tally.redis_cpu / tally.requests * 1000:>14.2f}"
        print(
            f"{name:<10}{median_rps:>9.1f}{percentile(latencies, 0.5) * 1000:>9.2f}"
            f"{percentile(latencies, 0.99) * 1000:>9.2f}{median_rps / relay_rps:>14.2f}x"
            f"{cpu_columns}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--step-rounds", type=int, default=30, help="rounds of the cost-against-history phase"
    )
    parser.add_argument(
        "--control-us", type=float, default=400.0, help="the control's fixed work per request"
    )
    parser.add_argument("--transcript", help="part of a transcript file name")
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="another checkout (say, a worktree of the parent commit): its proxy runs as the "
        "targets memory@ and redis@, side by side with this one's (0 --step-rounds: skip the "
        "history phase)",
    )
    parser.add_argument(
        "--against-python",
        metavar="PATH",
        help="another interpreter (a venv's python): memory@ and redis@ run under it",
    )
    parser.add_argument(
        "--held-key",
        action="store_true",
        help="every proxy holds the upstream key, and its clients send client keys",
    )
    parser.add_argument(
        "--format",
        choices=sorted(REQUEST_FORMS),
        default="chat",
        dest="form",
        help="the requests as that wire format's agents send them",
    )
    args = parser.parse_args(argv)
    asyncio.run(
        run(
            args.rounds,
            args.step_rounds,
            args.control_us,
            args.transcript,
            args.against,
            args.held_key,
            REQUEST_FORMS[args.form],
            args.against_python,
        )
    )


if __name__ == "__main__":
    main()
