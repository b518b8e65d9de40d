"""A bare aiohttp relay: forwards bytes to the upstream and back, parses nothing.

The baseline the proxy's overhead is measured against.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

_DROP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


def relay_app(upstream: str, big_upstream: str | None = None) -> web.Application:
    """Forwards to ``upstream``, or to ``big_upstream`` when the request says
    ``X-Bench-Upstream: big`` (the event-loop benchmark's second lane)."""
    app = web.Application(client_max_size=256 * 1024 * 1024)
    client_key = web.AppKey("client", aiohttp.ClientSession)

    async def client_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        async with aiohttp.ClientSession() as session:
            app[client_key] = session
            yield

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        body = await request.read()
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
    args = parser.parse_args()
    web.run_app(
        relay_app(args.upstream, args.big_upstream),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
    )
