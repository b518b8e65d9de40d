"""Typed application keys: every resource the handlers share, in one place."""

from __future__ import annotations

from collections import Counter

import aiohttp
from aiohttp import web

from proxy.client_keys import ClientKeys
from proxy.compaction.background import BackgroundCompactions
from proxy.compaction.engine import Engine
from proxy.config import Settings
from proxy.known_messages import KnownMessages
from proxy.policy import PolicyBook
from proxy.recent_bodies import RecentBodies
from proxy.store.base import Store
from proxy.tasks import PendingRecords
from proxy.tenant import TenantSecret
from proxy.windows import LearnedWindows

SETTINGS = web.AppKey("settings", Settings)
HTTP_CLIENT = web.AppKey("http_client", aiohttp.ClientSession)
STORE = web.AppKey("store", Store)
TENANT_SECRET = web.AppKey("tenant_secret", TenantSecret)
ENGINE = web.AppKey("engine", Engine)
POLICIES = web.AppKey("policies", PolicyBook)
LEARNED_WINDOWS = web.AppKey("learned_windows", LearnedWindows)
# Requests being forwarded per conversation on this process (manual compaction waits for 0).
IN_FLIGHT: web.AppKey[Counter[str]] = web.AppKey("in_flight")
CLIENT_KEYS = web.AppKey("client_keys", ClientKeys)
BACKGROUND = web.AppKey("background", BackgroundCompactions)
KNOWN_MESSAGES = web.AppKey("known_messages", KnownMessages)
RECENT_BODIES = web.AppKey("recent_bodies", RecentBodies)
PENDING_RECORDS = web.AppKey("pending_records", PendingRecords)
