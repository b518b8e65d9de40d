"""The aiohttp application factory: typed app keys, resources opened and closed in cleanup_ctx."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from proxy import handlers, lazy_litellm
from proxy.admin import admin_routes
from proxy.client_keys import ClientKeys, holds_upstream_keys, load_client_key_digests
from proxy.compaction.background import BackgroundCompactions
from proxy.compaction.engine import Engine, EngineSettings
from proxy.config import ConfigError, Settings
from proxy.credentials import ConfigProblem, credential_problems
from proxy.errors import error_response
from proxy.inspector import inspector_routes
from proxy.keys import (
    BACKGROUND,
    CLIENT_KEYS,
    ENGINE,
    HTTP_CLIENT,
    IN_FLIGHT,
    KNOWN_MESSAGES,
    LEARNED_WINDOWS,
    PENDING_RECORDS,
    POLICIES,
    RECENT_BODIES,
    SETTINGS,
    STORE,
    TENANT_SECRET,
)
from proxy.known_messages import KnownMessages
from proxy.loops import self_loop_problems
from proxy.meter import TokenMeter
from proxy.metrics import REQUESTS, initialize_label_sets, metrics_handler
from proxy.passthrough import passthrough
from proxy.policy import PolicyBook, validate_all_policies
from proxy.recent_bodies import RecentBodies
from proxy.store import StoreUnavailable, open_store
from proxy.tasks import PendingRecords
from proxy.tenant import TenantSecret, api_key_of
from proxy.tokenizers import warm_up
from proxy.upstream import HOP_HEADER
from proxy.windows import LearnedWindows, model_map

log = logging.getLogger(__name__)


async def _http_client(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    connector = aiohttp.TCPConnector(limit=settings.upstream_pool_size, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=settings.upstream_connect_timeout,
        sock_read=settings.upstream_read_timeout,
    )
    # One session serves every client, so it keeps no cookies: a cookie the upstream sets
    # (a CDN's, say) goes to the client it answered and is never sent for another.
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        skip_auto_headers=("User-Agent",),
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:
        app[HTTP_CLIENT] = session
        yield


async def _store(app: web.Application) -> AsyncIterator[None]:
    store = open_store(app[SETTINGS])
    app[STORE] = store
    try:
        yield
    finally:
        await store.close()


async def _tenant_secret(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    configured = settings.tenant_secret
    if configured is None:
        where = (
            "for the life of this process"
            if settings.store_url.startswith("memory://")
            else "in the store, shared by every replica"
        )
        log.warning("no tenant_secret configured: one is generated and kept %s", where)
    secret = TenantSecret(
        configured.get_secret_value().encode() if configured is not None else None, app[STORE]
    )
    app[TENANT_SECRET] = secret
    try:
        await secret.get()
    except StoreUnavailable:
        log.warning("store unavailable at start-up: requests bypass it until it answers")
    yield


async def _engine(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # An encoding's load takes most of a second: pay it at start-up, not on a request.
    await asyncio.to_thread(warm_up)
    await asyncio.to_thread(model_map)
    # litellm's import takes seconds: the proxy listens meanwhile (see proxy.lazy_litellm).
    importing = asyncio.create_task(lazy_litellm.import_in_background())
    meter = TokenMeter(cache_size=settings.meter_cache_size)
    engine_settings = EngineSettings(
        lease_ttl_seconds=settings.lease_ttl_seconds,
        lease_wait_seconds=settings.summary_timeout_seconds + settings.lease_ttl_seconds,
        breaker_cooldown_seconds=settings.summary_breaker_cooldown_seconds,
        max_rounds=settings.max_compaction_rounds,
        failure_cooldown_seconds=settings.failure_cooldown_seconds,
        failure_growth_ratio=settings.failure_growth_ratio,
        summaries_per_minute_per_tenant=settings.summaries_per_minute_per_tenant,
        summaries_per_minute_per_route=settings.summaries_per_minute_per_route,
        log_content=settings.log_content,
    )
    app[ENGINE] = Engine(app[STORE], meter, engine_settings)
    yield
    importing.cancel()  # stops waiting for it; the thread itself ends with the import


async def _background(app: web.Application) -> AsyncIterator[None]:
    """Background compactions; cancelled on shutdown while the store is still open, so each
    closes its attempt and frees its lease."""
    background = BackgroundCompactions(app[ENGINE], app[SETTINGS].precompact_concurrency)
    app[BACKGROUND] = background
    yield
    await background.close()


async def _pending_records(app: web.Application) -> AsyncIterator[None]:
    """Writes made after answers; the last ones finish at shutdown, before the store closes."""
    app[PENDING_RECORDS] = PendingRecords()
    yield
    await app[PENDING_RECORDS].drain()


def refusal(request: web.Request) -> web.StreamResponse | None:
    """Why a ``/v1/`` request is refused before its handler runs, if it is: it carries our hop
    marker, so a proxy sent it and forwarding it again could go on forever (see
    ``proxy.loops``); or the proxy holds upstream keys and the request holds no client key."""
    if HOP_HEADER in request.headers:
        REQUESTS.labels(route="", outcome="loop_detected").inc()
        return error_response(
            508,
            "This request already passed through a compaction proxy and would be forwarded "
            "to one again: check that the proxy's upstream is not the proxy itself.",
            code="loop_detected",
        )
    keys = request.app[CLIENT_KEYS]
    if keys.required and not keys.allows(api_key_of(request.headers)):
        REQUESTS.labels(route="", outcome="unauthorized").inc()
        return error_response(
            401,
            "Incorrect API key provided: use a client key issued for this proxy.",
            code="invalid_api_key",
        )
    return None


def guarded(handler: Handler) -> Handler:
    """``handler`` behind ``refusal``: every ``/v1/`` route is built with it.

    A wrapper per route rather than application middlewares: with any middleware at all,
    aiohttp runs every request, on every route, through the chain and through a middleware of
    its own that sets and restores the current app, three coroutines where one does."""

    async def checked(request: web.Request) -> web.StreamResponse:
        refused = refusal(request)
        if refused is not None:
            return refused
        return await handler(request)

    return checked


def create_app(settings: Settings) -> web.Application:
    """Build the proxy. Invalid per-model policies, and keys that would go to the wrong host
    or not at all, fail here, before serving."""
    validate_all_policies(settings)
    problems = [*credential_problems(settings, os.environ), *self_loop_problems(settings)]
    client_keys = ClientKeys(load_client_key_digests(settings), holds_upstream_keys(settings))
    if client_keys.required and not client_keys.digests:
        problems.append(
            ConfigProblem(
                "client_keys_file",
                "a route holds an upstream key (api_key_env), so clients must authenticate "
                "with keys of their own: create one with `compaction-proxy client-key new` and "
                "list its digest in client_keys_file or client_key_digests",
            )
        )
    if problems:
        raise ConfigError("\n".join(["refusing to start:", *(f"  {p}" for p in problems)]))
    # Room above the limit so that an oversized body is answered by the handler in
    # OpenAI's error shape rather than by aiohttp's plain-text 413.
    app = web.Application(
        client_max_size=settings.max_body_bytes + 1,
        # Bodies as they came, whatever serves the app: ``intake.read_body`` decodes them
        # (see ``proxy.content_coding`` for why not aiohttp's parser).
        handler_args={"auto_decompress": False},
    )
    app[SETTINGS] = settings
    app[CLIENT_KEYS] = client_keys
    initialize_label_sets()
    app[POLICIES] = PolicyBook(settings)
    app[LEARNED_WINDOWS] = LearnedWindows()
    app[IN_FLIGHT] = Counter()
    app[KNOWN_MESSAGES] = KnownMessages(settings.known_messages_bytes)
    app[RECENT_BODIES] = RecentBodies(settings.recent_bodies_bytes)
    app.cleanup_ctx.append(_store)
    app.cleanup_ctx.append(_tenant_secret)
    app.cleanup_ctx.append(_engine)
    app.cleanup_ctx.append(_background)
    app.cleanup_ctx.append(_http_client)
    app.cleanup_ctx.append(_pending_records)
    app.add_routes(
        [
            web.post("/v1/chat/completions", guarded(handlers.chat_completions)),
            web.post("/v1/responses", guarded(handlers.responses)),
            web.get("/v1/models", guarded(handlers.list_models)),
            web.get("/healthz", handlers.healthz),
            web.get("/readyz", handlers.readyz),
            web.get("/metrics", metrics_handler),
            *admin_routes(),
            *inspector_routes(),
            # Last: every other /v1/ path and method (chat's own paths are matched first).
            web.route("*", "/v1/{tail:.*}", guarded(passthrough)),
        ]
    )
    return app
