"""What a turn costs over a WebSocket against the same turn over HTTP, side by side in one run.

Run: ``python -m tests.bench.socket_turns [--rounds N] [--transcript NAME] [--frames
new|whole]``. Not collected by pytest. One proxy process (in-process store) before an instant
upstream that answers each request with the transcript's own next turn
(``tests.bench.transcript_upstream``); each round replays the transcript's requests in
Responses form, streamed, as a fresh conversation twice: over HTTP (each a ``POST
/v1/responses``, its events read to the end) and over one WebSocket (each a ``response.create``
frame, its events read up to ``response.completed``), the two in alternating order round by
round. With ``--frames new`` (the default, as Codex sends them) a frame names the last
response and carries only what followed it; with ``whole`` every frame carries the whole
input, as the POST does. The upstream gets the same requests either way.

Printed: per transport, the proxy's CPU time per turn (Linux schedstat of every thread) and
the median latency per turn, for all turns and the last tenth; then socket / HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import aiohttp
import orjson

from tests.bench.overhead import at_rest, cpu_jiffies, metered_env, process, run_ns, stolen_since
from tests.processes import free_port, proxy_process, wait_until_ready
from tests.transcripts import BASH_TOOL, as_responses_body, replay_requests, transcript_named

MODEL = "bench-model"
HEADERS = {"Authorization": "Bearer bench", "Content-Type": "application/json"}


async def over_http(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> None:
    headers = {**HEADERS, "X-Session-Id": body["prompt_cache_key"]}
    async with http.post(f"{base}/v1/responses", data=orjson.dumps(body), headers=headers) as got:
        assert got.status == 200, got.status
        await got.read()


async def over_socket(
    socket: aiohttp.ClientWebSocketResponse, body: dict[str, Any]
) -> dict[str, Any]:
    """One frame's turn; the response it completed."""
    await socket.send_str(orjson.dumps({"type": "response.create", **body}).decode())
    while True:
        message = await socket.receive()
        event = orjson.loads(message.data)
        assert event["type"] != "error", event
        if event["type"] == "response.completed":
            response: dict[str, Any] = event["response"]
            return response


def frame_for(body: dict[str, Any], last: tuple[str, int] | None) -> dict[str, Any]:
    """``body`` as a frame continuing ``last`` (its id, and how many input items it and its
    output make): only what follows them."""
    if last is None:
        return body
    response_id, known = last
    return {**body, "previous_response_id": response_id, "input": body["input"][known:]}


def bodies_for(name: str) -> list[dict[str, Any]]:
    transcript = transcript_named(name)
    bodies = []
    for history in replay_requests(transcript.messages):
        body = as_responses_body(MODEL, history)
        body.setdefault("tools", BASH_TOOL)
        bodies.append({**body, "stream": True, "store": False})
    return bodies


async def one_round(
    http: aiohttp.ClientSession,
    base: str,
    bodies: list[dict[str, Any]],
    transport: str,
    pid: int,
    whole: bool = False,
) -> tuple[list[int], list[float]]:
    """One replay as a fresh conversation over ``transport``: CPU ns and latency per turn.
    ``whole``: every frame carries the whole input."""
    session = f"bench-{uuid.uuid4().hex}"
    fresh = [{**body, "prompt_cache_key": session} for body in bodies]
    cpu, latency = [], []
    headers = {**HEADERS, "X-Session-Id": session}
    socket, last = None, None
    if transport == "socket":
        socket = await http.ws_connect(
            f"{base.replace('http', 'ws')}/v1/responses", headers=headers
        )
    try:
        for body in fresh:
            before, started = run_ns([pid]), time.perf_counter()
            if socket is None:
                await over_http(http, base, body)
            else:
                response = await over_socket(socket, frame_for(body, None if whole else last))
                last = (response["id"], len(body["input"]) + len(response["output"]))
            latency.append(time.perf_counter() - started)
            await asyncio.sleep(0.002)  # the proxy's work after the answer (its log) is the turn's
            cpu.append(run_ns([pid]) - before)
    finally:
        if socket is not None:
            await socket.close()
    return cpu, latency


def summary(values: list[list[float]]) -> tuple[float, float]:
    """The median over every turn of every round, and over the last tenth."""
    every = [v for round_ in values for v in round_]
    tenth = max(1, len(values[0]) // 10)
    last = [v for round_ in values for v in round_[-tenth:]]
    return statistics.median(every), statistics.median(last)


async def run(args: argparse.Namespace) -> None:
    bodies = bodies_for(args.transcript)
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    answers = ("-m", "tests.bench.transcript_upstream", "--port", str(upstream_port))
    async with process(*answers, "--transcript", args.transcript):
        await wait_until_ready(f"{upstream}/v1/models")
        async with proxy_process(metered_env(upstream)) as (proxy, base):
            await at_rest([proxy.pid])
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                whole = args.frames == "whole"
                for transport in ("http", "socket"):  # warm both paths
                    await one_round(http, base, bodies[:20], transport, proxy.pid, whole)
                cpu: dict[str, list[list[float]]] = {"http": [], "socket": []}
                latency: dict[str, list[list[float]]] = {"http": [], "socket": []}
                stolen = cpu_jiffies()
                for turn in range(args.rounds):
                    order = ("http", "socket") if turn % 2 == 0 else ("socket", "http")
                    for transport in order:
                        ns, seconds = await one_round(
                            http, base, bodies, transport, proxy.pid, whole
                        )
                        cpu[transport].append([n / 1e6 for n in ns])
                        latency[transport].append([s * 1e3 for s in seconds])
    print(
        f"{args.transcript}: {len(bodies)} turns a replay, {args.rounds} rounds of each, "
        f"frames carrying {'the whole input' if args.frames == 'whole' else 'what is new'}"
    )
    print(stolen_since(stolen))
    print(
        f"{'transport':<10} {'CPU ms/turn':>12} {'last tenth':>11} {'p50 ms':>8} {'last tenth':>11}"
    )
    rows = {}
    for transport in ("http", "socket"):
        rows[transport] = (*summary(cpu[transport]), *summary(latency[transport]))
        print(f"{transport:<10}" + "".join(f" {v:>11.3f}" for v in rows[transport]))
    ratios = [s / h for s, h in zip(rows["socket"], rows["http"], strict=True)]
    print(f"{'socket/http':<10}" + "".join(f" {r:>10.2f}x" for r in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--transcript", default="django-13265")
    parser.add_argument("--frames", choices=["new", "whole"], default="new")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
