"""``GET /metrics``: the Prometheus exposition of ``metrics``."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from compaction_proxy.metrics import exposition_registry


async def metrics_handler(request: web.Request) -> web.Response:
    response = web.Response(body=generate_latest(exposition_registry()))
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response
