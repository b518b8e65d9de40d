"""The proxy with some of its stages left out, for ``tests.bench.stages`` (never for users).

Run as ``python -m tests.bench.stage_proxy serve ...`` with ``BENCH_WITHOUT`` naming the stages
to leave out, comma-separated:

* ``record``: nothing is written after the answer (no log, no usage, no anchor);
* ``prepare``: nothing is loaded, metered or decided: the client's bytes go on as sent, and so
  nothing is recorded either;
* ``parse``: the body is not parsed or validated (with ``prepare`` only: the request names
  ``BENCH_MODEL``, which is what the benchmark sends).

What is left is the proxy's own code, run as ``compaction-proxy serve`` runs it.
"""

from __future__ import annotations

import os
import sys

from proxy import handlers
from proxy.cli import main
from proxy.client_request import ClientRequest
from proxy.preparation import Prepared

STAGES = frozenset({"record", "prepare", "parse"})


def leave_out(stages: set[str], model: str) -> None:
    unknown = stages - STAGES
    if unknown:
        raise SystemExit(f"unknown stages: {sorted(unknown)} (known: {sorted(STAGES)})")
    if "parse" in stages and "prepare" not in stages:
        raise SystemExit("'parse' can be left out only with 'prepare'")
    if "record" in stages:

        async def no_record(*_: object) -> None:
            return None

        handlers._record = no_record  # type: ignore[assignment]
    if "prepare" in stages:

        async def forwarded_as_sent(
            _request: object, client_request: ClientRequest, *_: object
        ) -> Prepared:
            return Prepared(payload=client_request.raw, status="none")

        handlers.prepare = forwarded_as_sent  # type: ignore[assignment]
    if "parse" in stages:

        def unparsed(raw: bytes, *_: object) -> ClientRequest:
            return ClientRequest(body={}, raw=raw, model=model, messages=[], stream=False)

        handlers.parse_chat_request = unparsed  # type: ignore[assignment]


if __name__ == "__main__":
    without = {s for s in os.environ.get("BENCH_WITHOUT", "").split(",") if s}
    leave_out(without, os.environ.get("BENCH_MODEL", "bench-model"))
    sys.exit(main(sys.argv[1:]))
