"""Typed application keys: every resource the handlers share, in one place."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.config import Settings

SETTINGS = web.AppKey("settings", Settings)
HTTP_CLIENT = web.AppKey("http_client", aiohttp.ClientSession)
TENANT_SECRET = web.AppKey("tenant_secret", bytes)
