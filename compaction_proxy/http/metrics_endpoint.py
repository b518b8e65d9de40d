"""``GET /metrics``: the Prometheus exposition of ``compaction_proxy.metrics``.

Built in a worker thread: a scrape walks every series (and, with several workers, reads every
worker's files), and on the event loop it would hold every client's request meanwhile."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from compaction_proxy.metrics import exposition_registry


async def metrics_handler(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(generate_latest, exposition_registry())
    response = web.Response(body=body)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response
