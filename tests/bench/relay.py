"""A bare aiohttp relay: forwards bytes to the upstream and back, parses nothing.

The baseline the proxy's overhead is measured against. With ``--work-us``, it also runs a
fixed piece of Python per request (hashing, small JSON, dicts: the kind of work the proxy does)
before forwarding: a control whose extra latency over the bare relay should not grow with the
body, so whatever growth it shows comes from the host (caches, neighbours), not from the code.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import time

import aiohttp
import orjson
from aiohttp import web

_DROP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


def _unit_of_work() -> None:
    digest = hmac.new(b"bench", b"key", hashlib.sha256).hexdigest()
    table = {}
    for index in range(20):
        message = {"role": "tool", "content": digest, "index": index}
        table[orjson.dumps(message)] = dict(message)


def units_for(microseconds: float) -> int:
    """How many units of work take ``microseconds`` on this machine (best of a few timings)."""
    best = float("inf")
    for _ in range(20):
        started = time.perf_counter()
        for _ in range(100):
            _unit_of_work()
        best = min(best, (time.perf_counter() - started) / 100)
    return max(1, round(microseconds / 1e6 / best))


def relay_app(
    upstream: str, big_upstream: str | None = None, work_units: int = 0
) -> web.Application:
    """Forwards to ``upstream``, or to ``big_upstream`` when the request says
    ``X-Bench-Upstream: big`` (the event-loop benchmark's second lane); runs ``work_units``
    units of fixed work per request first."""
    app = web.Application(client_max_size=256 * 1024 * 1024)
    client_key = web.AppKey("client", aiohttp.ClientSession)

    async def client_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        async with aiohttp.ClientSession() as session:
            app[client_key] = session
            yield

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        body = await request.read()
        for _ in range(work_units):
            _unit_of_work()
        lane = request.headers.get("X-Bench-Upstream")
        base = big_upstream if big_upstream and lane == "big" else upstream
        url = base + request.path_qs.removeprefix("/v1")
        async with app[client_key].request(request.method, url, data=body, headers=headers) as up:
            out = {k: v for k, v in up.headers.items() if k.lower() not in _DROP}
            response = web.StreamResponse(status=up.status, headers=out)
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.cleanup_ctx.append(client_ctx)
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--big-upstream")
    parser.add_argument("--work-us", type=float, default=0.0, help="fixed work per request")
    args = parser.parse_args()
    units = units_for(args.work_us) if args.work_us > 0 else 0
    web.run_app(
        relay_app(args.upstream, args.big_upstream, units),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
    )
