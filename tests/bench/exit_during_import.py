"""Stopping while litellm's import runs: how often a process hangs, each way it can stop.

Run: ``python -m tests.bench.exit_during_import [--trials 20]``. Not collected by pytest. Each
trial is a ``tests.exit_probe`` process (litellm's import in its daemon thread, as in ``serve``)
stopped while that thread holds the interpreter's import lock: ``finalize`` as a Python program
stops, with a destructor failing at finalization; ``quiet`` the same without that destructor;
``proxy`` as ``serve`` leaves. A process still running ``HANG_SECONDS`` on is a hang (killed).
First, how often the import thread holds the lock over a whole import (``sample``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

MODES = ("finalize", "quiet", "proxy")
HANG_SECONDS = 10.0


async def probe(mode: str) -> tuple[float | None, str]:
    """One probe process: its run time (None: it hung and was killed), and its last line."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.exit_probe",
        mode,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = ""
    try:
        async with asyncio.timeout(HANG_SECONDS):
            line = (await process.stdout.readline()).decode().strip()
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
        return None, line
    return time.monotonic() - started, line


async def run(trials: int, parallel: int) -> None:
    _, sampled = await probe("sample")
    print(f"over one whole import: {sampled}")
    slots = asyncio.Semaphore(parallel)

    async def one(mode: str) -> tuple[float | None, str]:
        async with slots:
            return await probe(mode)

    print(f"\n{'stopping':<10}{'trials':>8}{'held at exit':>14}{'hangs':>7}{'exit, median s':>16}")
    for mode in MODES:
        results = await asyncio.gather(*(one(mode) for _ in range(trials)))
        held = sum(line.endswith("True") for _, line in results)
        times = [t for t, _ in results if t is not None]
        hangs = trials - len(times)
        median = f"{statistics.median(times):.2f}" if times else "-"
        print(f"{mode:<10}{trials:>8}{held:>14}{hangs:>7}{median:>16}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(run(args.trials, args.parallel))


if __name__ == "__main__":
    main()
