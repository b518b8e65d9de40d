"""A proxy and the upstream behind it on an event loop of their own, in a thread: for the
property tests, which are synchronous, and a plain blocking HTTP client to speak to it."""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from compaction_proxy.config.settings import load_settings
from compaction_proxy.ops.app import create_app

# The model every route of these proxies serves, and its (small) window: a few turns reach
# the threshold, so requests are pruned and summarized.
MODEL = "fuzz-small"
WINDOW = 4_000
ADMIN_TOKEN = "fuzz-admin-token-0123456789"


@contextmanager
def serving(upstream: web.Application, **extra: Any) -> Iterator[int]:
    """``upstream`` and a proxy routing ``MODEL`` to it (``extra`` settings on top); yields
    the proxy's port, and stops both on the way out."""
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []
    ports: list[int] = []

    async def start() -> None:
        upstream_runner = web.AppRunner(upstream)
        await upstream_runner.setup()
        await web.TCPSite(upstream_runner, "127.0.0.1", 0).start()
        runners.append(upstream_runner)
        base_url = f"http://127.0.0.1:{upstream_runner.addresses[0][1]}/v1"
        route: dict[str, Any] = {"model": MODEL, "base_url": base_url, "context_window": WINDOW}
        if "upstream_api_key_env" in extra:
            route["api_key_env"] = extra["upstream_api_key_env"]
            route["account_endpoints"] = extra.get("account_endpoints", "refused")
        settings = load_settings(
            None,
            upstream_base_url=base_url,
            tenant_secret="fuzz-secret",
            routes=[route],
            anthropic_base_url=base_url,
            admin_token=ADMIN_TOKEN,
            **extra,
        )
        proxy = web.AppRunner(create_app(settings))
        await proxy.setup()
        await web.TCPSite(proxy, "127.0.0.1", 0).start()
        runners.insert(0, proxy)
        ports.append(proxy.addresses[0][1])

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
        yield ports[0]
    finally:

        async def stop() -> None:
            for runner in runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def send(
    port: int, path: str, body: bytes, headers: list[tuple[str, bytes | str]], method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    """One request to the proxy: its status, headers (names lowered) and whole body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest(method, path)
        for name, value in headers:
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        lowered = {name.lower(): value for name, value in response.getheaders()}
        return response.status, lowered, response.read()
    finally:
        connection.close()
