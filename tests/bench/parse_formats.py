"""What parsing a request costs in each wire format: is a Messages request as cheap as chat?

Run: ``python -m tests.bench.parse_formats [--transcript NAME] [--rounds N]``. Replays one
transcript's requests (before every assistant message, the history so far) in chat, Responses
and Messages form, each through its adapter as the proxy parses it (``WireFormat.parse`` with
one process's caches: bodies extending a recent one are parsed from where they differ) and
parsed whole (no caches), rounds interleaved. Prints the median CPU time per request in the
first and last tenth of the replay, and each format's ratio to chat's: a format whose last
tenth costs what its first does parses what is new, not the history.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.formats.wire_formats import CHAT, MESSAGES, RESPONSES
from compaction_proxy.parsing.recent_bodies import RecentBodies
from tests.transcripts import (
    BASH_TOOL,
    as_messages_body,
    as_responses_body,
    replay_requests,
    transcripts,
)

MODEL = "bench-model"

Writer = Callable[[list[dict[str, Any]]], dict[str, Any]]
FORMATS: dict[str, tuple[WireFormat, Writer]] = {
    "chat": (CHAT, lambda history: {"model": MODEL, "messages": history, "tools": BASH_TOOL}),
    "responses": (RESPONSES, lambda history: as_responses_body(MODEL, history)),
    "messages": (MESSAGES, lambda history: as_messages_body(MODEL, history)),
}


def replay_times(wire: WireFormat, bodies: list[bytes], cached: bool) -> list[float]:
    """Thread CPU seconds of each body's parse, in order, one conversation."""
    known, recent = KnownMessages(), RecentBodies(max_bytes=0 if not cached else 256 << 20)
    session = uuid.uuid4().hex
    spent: list[float] = []
    for raw in bodies:
        context = ParseContext(known if cached else KnownMessages(), recent, session)
        started = time.thread_time()
        wire.parse(raw, context)
        spent.append(time.thread_time() - started)
    return spent


def tenths(times: list[list[float]]) -> tuple[float, float]:
    """Median of the first and last tenth of the replay, over every round (milliseconds)."""
    count = len(times[0])
    tenth = max(1, count // 10)
    first = [t for run in times for t in run[:tenth]]
    last = [t for run in times for t in run[-tenth:]]
    return statistics.median(first) * 1000, statistics.median(last) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", default="django-13265")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    every = transcripts()
    chosen = next((t for t in every if args.transcript in t.name), every[0])
    histories = replay_requests(chosen.messages)
    bodies = {
        name: [orjson.dumps(write(history)) for history in histories]
        for name, (_, write) in FORMATS.items()
    }
    mean_kib = statistics.mean(len(b) for b in bodies["chat"]) / 1024
    print(
        f"transcript {chosen.name}: {len(histories)} requests, chat bodies {mean_kib:.0f} KiB "
        f"on average, {args.rounds} rounds"
    )
    results: dict[tuple[str, bool], list[list[float]]] = {}
    for _ in range(args.rounds):
        for name, (wire, _) in FORMATS.items():
            for cached in (True, False):
                results.setdefault((name, cached), []).append(
                    replay_times(wire, bodies[name], cached)
                )
    chat_last = tenths(results[("chat", True)])[1]
    print(f"\n{'format':<11}{'parse':<8}{'first 10% ms':>14}{'last 10% ms':>13}", end="")
    print(f"{'last/first':>12}{'last / chat':>13}")
    for (name, cached), times in results.items():
        first, last = tenths(times)
        how = "as run" if cached else "whole"
        print(
            f"{name:<11}{how:<8}{first:>14.3f}{last:>13.3f}{last / first:>11.2f}x"
            f"{last / chat_last:>12.2f}x"
        )


if __name__ == "__main__":
    main()
