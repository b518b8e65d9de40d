"""The proxy with some of its stages left out, for ``tests.bench.stages`` (never for users).

Run as ``python -m tests.bench.stage_proxy serve ...`` with ``BENCH_WITHOUT`` naming the stages
to leave out, comma-separated:

* ``record``: nothing is written after the answer (no log, no usage, no anchor);
* ``prepare``: nothing is loaded, metered or decided: the client's bytes go on as sent, and so
  nothing is recorded either;
* ``parse``: the body is not parsed or validated (with ``prepare`` only: the request names
  ``BENCH_MODEL``, which is what the benchmark sends).

What is left is the proxy's own code, run as ``compaction-proxy serve`` runs it.

With ``BENCH_TIMINGS`` naming a file, the proxy whole appends a line to it per request once
its record is written: the request's body length (its position in a replay), its
conversation's generation (1 and up once a checkpoint was committed), then the thread CPU time
in nanoseconds of its parse, its preparation and its record. That is the proxy's own
work measured where it runs, with no baseline subtracted (``tests.bench.overhead`` reads it for
the cost against history length). Six clock reads a request: about 3.5 us on the host this was
written on.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire_formats import CHAT
from compaction_proxy.ops.cli import main
from compaction_proxy.service import exchange
from compaction_proxy.service.forwarded import Forwarded, RequestStatus
from compaction_proxy.service.prepare import prepare
from compaction_proxy.service.request_log import RequestLogEntry

STAGE_NAMES = ("parse", "prepare", "record")  # in a request's order: a timings line's columns
STAGES = frozenset(STAGE_NAMES)


def leave_out(stages: set[str], model: str) -> None:
    unknown = stages - STAGES
    if unknown:
        raise SystemExit(f"unknown stages: {sorted(unknown)} (known: {sorted(STAGES)})")
    if "parse" in stages and "prepare" not in stages:
        raise SystemExit("'parse' can be left out only with 'prepare'")
    if "record" in stages:

        async def no_record(*_: object) -> None:
            return None

        exchange._write_log = no_record  # type: ignore[assignment]
    if "prepare" in stages:

        async def forwarded_as_sent(
            _services: object, client_request: ClientRequest, *_: object
        ) -> tuple[Forwarded, None]:
            # No record: nothing is written after the answer either.
            return Forwarded(payload=client_request.raw, status=RequestStatus.NONE), None

        exchange.prepare = forwarded_as_sent  # type: ignore[attr-defined,assignment]
    if "parse" in stages:

        def unparsed(raw: bytes, *_: object) -> ClientRequest:
            return ClientRequest(
                body={}, raw=raw, model=model, messages=[], stream=False, wire=CHAT
            )

        CHAT.parse = unparsed  # type: ignore[assignment]


def time_stages(out: IO[str]) -> None:
    """Time each request's parse, preparation and record (see the module's docstring)."""
    parse, record = CHAT.parse, exchange._write_log
    parsed: dict[int, int] = {}  # id(client request) -> its parse's CPU time
    prepared: dict[int, tuple[int, int]] = {}  # id(RequestLogEntry) -> parse, prepare

    def timed_parse(*args: Any, **kwargs: Any) -> ClientRequest:
        started = time.thread_time_ns()
        client_request = parse(*args, **kwargs)
        parsed[id(client_request)] = time.thread_time_ns() - started
        return client_request

    async def timed_prepare(
        services: Any, client_request: ClientRequest, *args: Any, **kwargs: Any
    ) -> tuple[Forwarded, RequestLogEntry]:
        parse_ns = parsed.pop(id(client_request), 0)
        started = time.thread_time_ns()
        forwarded, request_record = await prepare(services, client_request, *args, **kwargs)
        prepared[id(request_record)] = (parse_ns, time.thread_time_ns() - started)
        return forwarded, request_record

    async def timed_record(
        services: Any, forwarded: Forwarded, request_record: RequestLogEntry, *args: Any
    ) -> None:
        started = time.thread_time_ns()
        await record(services, forwarded, request_record, *args)
        spent = time.thread_time_ns() - started
        parse_ns, prepare_ns = prepared.pop(id(request_record), (0, 0))
        body = len(request_record.log.view.body)
        out.write(f"{body} {forwarded.generation} {parse_ns} {prepare_ns} {spent}\n")

    CHAT.parse = timed_parse  # type: ignore[method-assign]
    exchange.prepare = timed_prepare  # type: ignore[attr-defined]
    exchange._write_log = timed_record  # type: ignore[assignment]


if __name__ == "__main__":
    timings = os.environ.get("BENCH_TIMINGS")
    if timings:
        time_stages(open(timings, "a", buffering=1))  # noqa: SIM115  # open while it serves
    without = {s for s in os.environ.get("BENCH_WITHOUT", "").split(",") if s}
    leave_out(without, os.environ.get("BENCH_MODEL", "bench-model"))
    sys.exit(main(sys.argv[1:]))
