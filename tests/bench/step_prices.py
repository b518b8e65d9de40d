"""What pricing a checkpoint costs a request over a soft target, against what the request's
own metering costs.

Run: ``python -m tests.bench.step_prices``. Not collected by pytest. Between a soft target's
precompaction watermark and the window's, every request that finds no round running prices a
checkpoint (``mask_step.checkpoint_pays``: a plan of the span, every node priced) until one
pays. Each transcript is replayed into one meter, and at a tenth, half and the whole of its
requests the decision is timed beside the request's measurement (both warm, as in a running
proxy, where the meter has seen every earlier message). Prints milliseconds per decision and
the ratio to a measurement.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.mask_step import checkpoint_pays
from compaction_proxy.compaction.model_policy import budgets
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.compaction.summarize import Summary
from compaction_proxy.config.settings import Policy
from compaction_proxy.metering.meter import TokenMeter
from compaction_proxy.store.memory import MemoryStore
from tests.transcripts import replay_requests, transcripts

ROUNDS = 30


async def never_called(_: object) -> Summary:
    raise AssertionError("pricing makes no summary call")


async def timed(engine: Engine, history: list[dict[str, object]]) -> tuple[int, float, float]:
    """The request's messages, and the decision's and the measurement's milliseconds."""
    view = RequestView.of("bench-tenant", "fake-model", history, None)
    job = CompactionJob(view, Policy(), Pruner(), 10_000_000, "fake-model", never_called)
    state = await engine.store.load(view.conversation)
    surface = view.surface(state.records)
    tokens = (await engine.measure(job, state, surface)).tokens
    # A soft target the request is just over, in a window far above it: a priced decision.
    limits = budgets(Policy(target_tokens=max(1, tokens)), 10 * tokens + 10_000)
    await checkpoint_pays(engine, job, state, surface, tokens, limits)  # warm, as served
    started = time.perf_counter()
    for _ in range(ROUNDS):
        await checkpoint_pays(engine, job, state, surface, tokens, limits)
    deciding = (time.perf_counter() - started) / ROUNDS * 1000
    started = time.perf_counter()
    for _ in range(ROUNDS):
        await engine.measure(job, state, surface)
    measuring = (time.perf_counter() - started) / ROUNDS * 1000
    return len(history), deciding, measuring


async def run() -> None:
    engine = Engine(MemoryStore(), TokenMeter())
    print(f"{'transcript':<44}{'messages':>9}{'decision ms':>13}{'measure ms':>12}{'ratio':>8}")
    ratios: list[float] = []
    for transcript in transcripts():
        requests = replay_requests(transcript.messages)
        for history in requests:  # the meter has seen every earlier message
            view = RequestView.of("bench-tenant", "fake-model", history, None)
            view.measure(engine.meter, view.surface(()))
        for share in (0.1, 0.5, 1.0):
            history = requests[max(0, int(len(requests) * share) - 1)]
            messages, deciding, measuring = await timed(engine, history)
            ratios.append(deciding / measuring)
            name = transcript.name[:43]
            print(
                f"{name:<44}{messages:>9}{deciding:>13.3f}{measuring:>12.4f}"
                f"{deciding / measuring:>7.0f}x"
            )
    print(f"median decision / measurement: {statistics.median(ratios):.0f}x")


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
