"""``serve --workers 2`` started and stopped over and over (SIGTERM, SIGINT, a worker killed
mid-request): no hang, every worker listening within seconds, a dead worker replaced, the
request in flight at a stop answered. ``python -m tests.bench.workers_stress`` runs the same
cycles 200 times (figures in docs/perf.md)."""

from __future__ import annotations

from tests.bench.workers_stress import KINDS, UP_SECONDS, run_cycles, summary
from tests.reports import report


async def test_workers_start_and_stop_again_and_again_without_a_hang() -> None:
    results = await run_cycles(cycles=2 * len(KINDS), parallel=1)
    for line in summary(results):
        report("Workers started and stopped (serve --workers 2)", line)
    assert [problem for cycle in results for problem in cycle.problems] == []
    assert all(cycle.answered for cycle in results)
    assert max(c.up for c in results if c.up is not None) < UP_SECONDS
    assert max(c.replaced for c in results if c.replaced is not None) < UP_SECONDS
    assert sum(c.replaced is not None for c in results) == 2  # each kill-worker cycle's
