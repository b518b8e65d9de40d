"""What a compacted conversation's request costs against the size of its agent's instructions.

Run: ``python -m tests.bench.instructions [--rounds N] [--sizes 1 8 32]``. Not collected by
pytest. A checkpoint is bound to the instructions it was made under
(``conversation.fingerprint``: the system prompt and tools, up to dates, ids and numbers), so
once a conversation is compacted every request asks which instructions it carries. Coding
agents send tens of KiB of them on every request.

The synthetic agent conversation (``tests/synthetic.py``) is replayed with a system prompt of
each size (prose with dates, ids and numbers in it, as agents write theirs) and twelve tool
definitions (10 KiB), a fresh conversation per round, through one proxy (``memory://``, a
window small enough that the conversation is compacted early; the fake upstream answers at
once, summaries too) that times its own work (``tests.bench.stage_proxy``). Printed per size:
the median thread CPU of a request's preparation and of its whole work (parse, preparation,
record), for the requests before the conversation's first checkpoint and for those after it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from collections import defaultdict
from typing import Any

import aiohttp
import orjson

from tests.bench.overhead import at_rest, metered_env, process, replay
from tests.processes import free_port, proxy_process, wait_until_ready
from tests.synthetic import WORDS, synthetic_transcripts
from tests.transcripts import replay_requests

MODEL = "bench-model"


def instructions(kib: float) -> str:
    """About ``kib`` KiB of an agent's system prompt, with the volatile details agents put in
    theirs (the date, a session id, line numbers) and the same text for the same size."""
    lines = [
        "You are a coding agent. Today is Monday, November 30, 2026, 22:17 UTC.",
        "Session 3f2a9c1e-1b2c-4d5e-8f90-123456789abc, run a1b2c3d4e5f6a7b8.",
    ]
    index = 0
    while sum(len(line) + 1 for line in lines) < kib * 1024:
        words = " ".join(WORDS[(index * 7 + k) % len(WORDS)] for k in range(14))
        lines.append(f"{index + 1}. Before you {words}, check line {index * 13} of the file.")
        index += 1
    return "\n".join(lines)


def tool_set(count: int = 12) -> list[dict[str, Any]]:
    """An agent's tool definitions, not quite 1 KiB each."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"{WORDS[index % len(WORDS)]}_{index}",
                "description": " ".join(WORDS[(index + k) % len(WORDS)] for k in range(60)),
                "parameters": {
                    "type": "object",
                    "properties": {
                        WORDS[k]: {"type": "string", "description": f"the {WORDS[k]} to use"}
                        for k in range(6)
                    },
                    "required": [WORDS[0]],
                },
            },
        }
        for index in range(count)
    ]


def bodies_with(system_prompt: str) -> list[bytes]:
    """The synthetic conversation's requests, with ``system_prompt`` and the tool set as its
    instructions."""
    messages = synthetic_transcripts()["synthetic-tools"]
    messages = [{"role": "system", "content": system_prompt}, *messages[1:]]
    tools = tool_set()
    return [
        orjson.dumps({"model": MODEL, "messages": history, "tools": tools})
        for history in replay_requests(messages)
    ]


def medians(path: str) -> dict[bool, tuple[int, float, float]]:
    """From a timed proxy's lines: for the requests before a checkpoint (False) and after
    (True), how many, and the median CPU (ms) of a preparation and of the whole work."""
    rows: dict[bool, list[tuple[int, int]]] = defaultdict(list)
    with open(path) as lines:
        for line in lines:
            _, generation, parse, prepare, record = map(int, line.split())
            rows[generation > 0].append((prepare, parse + prepare + record))
    return {
        after: (
            len(found),
            statistics.median(p for p, _ in found) / 1e6,
            statistics.median(w for _, w in found) / 1e6,
        )
        for after, found in rows.items()
    }


async def run(rounds: int, sizes: list[float], window: int) -> None:
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    timings = tempfile.NamedTemporaryFile(prefix="bench-timings-", delete=False)  # noqa: SIM115
    timings.close()
    route = {"model": "*", "base_url": f"{upstream}/v1", "context_window": window}
    env = {
        **metered_env(upstream),
        "COMPACTION_PROXY_ROUTES": orjson.dumps([route]).decode(),
        "COMPACTION_PROXY_STORE_URL": "memory://",
        # Every round is the same client: each may summarize as a new conversation would.
        "COMPACTION_PROXY_SUMMARIES_PER_MINUTE_PER_TENANT": "0",
        "COMPACTION_PROXY_SUMMARIES_PER_MINUTE_PER_ROUTE": "0",
        "BENCH_TIMINGS": timings.name,
    }
    print(
        f"synthetic-tools, {rounds} rounds per size, a {window:,}-token window, a fresh "
        "conversation per round; median thread CPU per request (ms), and how many requests"
    )
    print(f"{'instructions':>13}  {'before a checkpoint':>30}  {'after it':>30}")
    print(f"{'':>13}  {'prepare':>10}{'all':>10}{'n':>10}  {'prepare':>10}{'all':>10}{'n':>10}")
    try:
        async with (
            process(
                "-m",
                "compaction_proxy.testing.fake_upstream",
                "--port",
                str(upstream_port),
                "--instant",
            ),
            proxy_process(env, module="tests.bench.stage_proxy") as (proxy, base),
            aiohttp.ClientSession() as http,
        ):
            await wait_until_ready(f"{upstream}/v1/models")
            await at_rest([proxy.pid])
            for kib in sizes:
                bodies = bodies_with(instructions(kib))
                await replay(http, base, bodies, 1)  # warm-up
                await asyncio.sleep(0.2)  # its last record
                os.truncate(timings.name, 0)
                for _ in range(rounds):
                    await replay(http, base, bodies, 1)
                await asyncio.sleep(0.2)
                line = f"{kib:>10.0f} KiB"
                found = medians(timings.name)
                for after in (False, True):
                    count, prepare, whole = found.get(after, (0, float("nan"), float("nan")))
                    line += f"  {prepare:>10.3f}{whole:>10.3f}{count:>10}"
                print(line)
    finally:
        os.unlink(timings.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.0, 8.0, 32.0])
    parser.add_argument("--window", type=int, default=32_000, help="the route's window")
    args = parser.parse_args(argv)
    asyncio.run(run(args.rounds, args.sizes, args.window))


if __name__ == "__main__":
    main()
