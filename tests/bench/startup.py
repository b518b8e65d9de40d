"""Start-up time: from ``python -m proxy serve`` to a listening socket, and to a first answer.

Run: ``python -m tests.bench.startup [--runs N]``. Not collected by pytest. Prints the median
and the worst of ``N`` runs, with the time to import litellm in a fresh interpreter beside it
(what start-up paid before litellm moved off the start-up path).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import aiohttp

from tests.bench.overhead import process
from tests.processes import free_port, serve_argv, wait_until_ready


async def until_listening(port: int) -> None:
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.005)


async def one_start(upstream: str) -> tuple[float, float]:
    port = free_port()
    env = {**os.environ, "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream}
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *serve_argv(port),
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await until_listening(port)
        listening = time.perf_counter() - started
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with http.post(url, json=body, headers={"Authorization": "Bearer b"}) as reply:
                assert reply.status == 200, reply.status
        return listening, time.perf_counter() - started
    finally:
        proc.terminate()
        await proc.wait()


async def run(runs: int) -> None:
    port = free_port()
    upstream = f"http://127.0.0.1:{port}/v1"
    async with process(
        "-m", "compaction_proxy.testing.fake_upstream", "--port", str(port), "--instant"
    ):
        await wait_until_ready(f"{upstream}/models")
        results = [await one_start(upstream) for _ in range(runs)]
    started = time.perf_counter()
    importer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import litellm",
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    await importer.wait()
    litellm = time.perf_counter() - started
    for label, values in (
        ("listening", [r[0] for r in results]),
        ("first answer", [r[1] for r in results]),
    ):
        print(f"{label:<14} median {statistics.median(values):5.2f} s  worst {max(values):5.2f} s")
    print(f"{'import litellm':<14} {litellm:5.2f} s (a fresh interpreter, for comparison)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(run(parser.parse_args().runs))


if __name__ == "__main__":
    main()
