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

from tests.exit_probe import ProbeRun, probe

MODES = ("finalize", "quiet", "proxy")
HANG_SECONDS = 10.0


async def run(trials: int, parallel: int) -> None:
    sampled = await probe("sample", HANG_SECONDS * 3)
    print(f"over one whole import: {sampled.line}")
    slots = asyncio.Semaphore(parallel)

    async def one(mode: str) -> ProbeRun:
        async with slots:
            return await probe(mode, HANG_SECONDS)

    print(f"\n{'stopping':<10}{'trials':>8}{'held at exit':>14}{'hangs':>7}{'exit, median s':>16}")
    for mode in MODES:
        results = await asyncio.gather(*(one(mode) for _ in range(trials)))
        held = sum(run.held for run in results)
        times = [run.seconds for run in results if run.seconds is not None]
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
