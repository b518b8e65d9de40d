"""The application's one key: the ``Services`` every handler serves requests with."""

from __future__ import annotations

from aiohttp import web

from compaction_proxy.service.services import Services

SERVICES = web.AppKey("services", Services)
