"""Metering cost against history length: does it follow new messages, not the history?

Run: ``python -m tests.bench.meter``. Replays every transcript (one meter per transcript, as a
proxy process keeps one) and times, per request, the meter's measurement of the surface
(given the message digests the request's chain hashing already produced), and separately that
hashing itself. Prints metering time per request by history length and, per transcript and
overall, the ratio of the last tenth's median to the first tenth's (close to 1 means the cost
follows new messages, not the history).
"""

from __future__ import annotations

import statistics
import time

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.metering.meter import TokenMeter
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.transcripts import replay_requests, transcripts


def main() -> None:
    fake = FakeUpstream()
    ratios: list[float] = []
    all_rows: list[tuple[int, float, float]] = []
    worst_error = 0.0
    hashing: list[tuple[int, float]] = []
    print(
        f"{'transcript':<58}{'reqs':>5}{'first10% ms':>13}{'last10% ms':>12}{'ratio':>7}"
        f"{'max err':>9}"
    )
    for transcript in transcripts():
        meter = TokenMeter()
        timings: list[float] = []
        for history in replay_requests(transcript.messages):
            hashing_started = time.perf_counter()
            view = RequestView.of("bench-tenant", "fake-model", history, None)
            surface = view.surface(())
            started = time.perf_counter()
            measured = view.measure(meter, surface)
            elapsed = time.perf_counter() - started
            hashing.append((len(history), started - hashing_started))
            timings.append(elapsed)
            all_rows.append((len(history), elapsed, measured.tokens))
            exact = fake.prompt_tokens({"messages": history})
            worst_error = max(worst_error, abs(measured.tokens - exact) / exact)
        tenth = max(1, len(timings) // 10)
        first = statistics.median(timings[:tenth])
        last = statistics.median(timings[-tenth:])
        ratios.append(last / first)
        print(
            f"{transcript.name[:57]:<58}{len(timings):>5}{first * 1000:>13.3f}{last * 1000:>12.3f}"
            f"{last / first:>7.2f}{worst_error:>9.4f}"
        )
    print()
    print("time per request by history length (all transcripts):")
    print(
        f"{'messages':>10}{'requests':>10}{'meter ms':>10}{'hashing ms':>12}{'median tokens':>15}"
    )
    for low in range(0, 400, 50):
        bucket = [(t, k) for n, t, k in all_rows if low <= n < low + 50]
        hashed = [t for n, t in hashing if low <= n < low + 50]
        if bucket:
            print(
                f"{f'{low}-{low + 49}':>10}{len(bucket):>10}"
                f"{statistics.median(t for t, _ in bucket) * 1000:>10.3f}"
                f"{statistics.median(hashed) * 1000:>12.3f}"
                f"{statistics.median(k for _, k in bucket):>15.0f}"
            )
    print()
    print(
        f"last-tenth / first-tenth median ratio: median {statistics.median(ratios):.2f}, "
        f"max {max(ratios):.2f} over {len(ratios)} transcripts"
    )
    print(f"worst meter error against the upstream's exact count: {worst_error:.2%}")


if __name__ == "__main__":
    main()
