"""The aiohttp application factory: typed app keys, resources opened and closed in cleanup_ctx."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from compaction_proxy.compaction.background import BackgroundCompactions
from compaction_proxy.compaction.engine import Engine, EngineSettings
from compaction_proxy.compaction.model_policy import PolicyBook
from compaction_proxy.config.policy import validate_all_policies
from compaction_proxy.config.settings import ConfigError, Settings
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.wire_formats import CHAT, MESSAGES, RESPONSES
from compaction_proxy.http import handlers
from compaction_proxy.http.admin_api import admin_routes
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import caller_format, error_response
from compaction_proxy.http.inspector import inspector_routes
from compaction_proxy.http.metrics_endpoint import metrics_handler
from compaction_proxy.http.passthrough import passthrough
from compaction_proxy.http.socket_endpoint import socket_endpoint
from compaction_proxy.http.upstream_client import AiohttpUpstream
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.meter import TokenMeter
from compaction_proxy.metering.tokenizers import use_bundled_tokenizers, warm_up
from compaction_proxy.metering.windows import LearnedWindows, model_map
from compaction_proxy.metrics import REQUESTS, initialize_label_sets, initialize_route_series
from compaction_proxy.ops.access_log import CLIENT_ADDRESS
from compaction_proxy.parsing.recent_bodies import RecentBodies
from compaction_proxy.security.client_keys import (
    ClientKeys,
    holds_upstream_keys,
    load_client_key_digests,
)
from compaction_proxy.security.credentials import ConfigProblem, credential_problems
from compaction_proxy.security.loopback import LOOPBACK_CLIENT_HEADER, LoopbackVouch
from compaction_proxy.security.outbound import HOP_HEADER
from compaction_proxy.security.paths import leaves_v1
from compaction_proxy.security.self_forwarding import self_loop_problems
from compaction_proxy.security.tenant import TenantSecret, api_key_of
from compaction_proxy.security.upload_slots import UploadSlots
from compaction_proxy.security.upstream_shares import UpstreamShares
from compaction_proxy.service.pending_writes import PendingLogWrites
from compaction_proxy.service.services import Services
from compaction_proxy.store import StoreUnavailable, open_store
from compaction_proxy.store.base import Store

log = logging.getLogger(__name__)


def _http_client(settings: Settings, pool_size: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=pool_size, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=settings.upstream_connect_timeout,
        sock_read=settings.upstream_read_timeout,
    )
    # One session serves every client, so it keeps no cookies: a cookie the upstream sets
    # (a CDN's, say) goes to the client it answered and is never sent for another.
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        skip_auto_headers=("User-Agent",),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def _tenant_secret(settings: Settings, store: Store) -> TenantSecret:
    configured = settings.tenant_secret
    if configured is None:
        where = (
            "for the life of this process"
            if settings.store_url.startswith("memory://")
            else "in the store, shared by every replica"
        )
        log.warning("no tenant_secret configured: one is generated and kept %s", where)
    secret = TenantSecret(
        configured.get_secret_value().encode() if configured is not None else None, store
    )
    try:
        await secret.get()
    except StoreUnavailable:
        log.warning("store unavailable at start-up: requests bypass it until it answers")
    return secret


async def _engine(settings: Settings, store: Store) -> Engine:
    # An encoding's load takes most of a second: pay it at start-up, not on a request.
    await asyncio.to_thread(warm_up)
    await asyncio.to_thread(model_map)
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
    return Engine(store, meter, engine_settings)


def _services_context(
    settings: Settings, client_keys: ClientKeys, loopback: LoopbackVouch
) -> Callable[[web.Application], AsyncIterator[None]]:
    """Opens the ``Services`` at start-up and closes them in reverse order at shutdown: the
    last pending records are written, then background rounds are cancelled (each closes its
    attempt as ``cancelled`` and frees its lease: its summary call is cancelled, not cut off by
    a closed client), then the HTTP clients close, and the store closes last."""

    async def services(app: web.Application) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            store = open_store(settings)
            stack.push_async_callback(store.close)
            tenant_secret = await _tenant_secret(settings, store)
            engine = await _engine(settings, store)
            # litellm's import takes seconds: the proxy listens meanwhile (lazy_litellm).
            importing = asyncio.create_task(lazy_litellm.import_in_background())
            # Stops waiting for it; the thread itself ends with the import.
            stack.callback(importing.cancel)
            background = BackgroundCompactions(engine, settings.precompact_concurrency)
            http_client = await stack.enter_async_context(
                _http_client(settings, settings.upstream_pool_size)
            )
            relay_client = await stack.enter_async_context(
                _http_client(settings, settings.relay_pool_size)
            )
            stack.push_async_callback(background.close)  # before the clients it calls through
            pending_log_writes = PendingLogWrites()
            stack.push_async_callback(pending_log_writes.drain, settings.shutdown_timeout)
            app[SERVICES] = Services(
                settings=settings,
                store=store,
                engine=engine,
                policies=PolicyBook(settings),
                learned_windows=LearnedWindows(),
                upstream=AiohttpUpstream(http_client),
                relay_upstream=AiohttpUpstream(relay_client),
                upload_slots=UploadSlots(
                    settings.max_uploads_per_client,
                    settings.max_uploads_per_address,
                    settings.upload_slots_total,
                ),
                upstream_shares=UpstreamShares(settings.upstream_share),
                client_keys=client_keys,
                tenant_secret=tenant_secret,
                background=background,
                known_messages=KnownMessages(settings.known_messages_bytes),
                recent_bodies=RecentBodies(settings.recent_bodies_bytes),
                pending_log_writes=pending_log_writes,
                loopback=loopback,
            )
            yield

    return services


_INVALID_PATH = (
    400,
    "invalid_path",
    "bad_request",
    "The request path leaves /v1/ once normalized (dot segments, or an absolute URL): send "
    "the path of an API endpoint.",
)
_LOOP = (
    508,
    "loop_detected",
    "loop_detected",
    "This request already passed through a compaction proxy and would be forwarded to one "
    "again: check that the proxy's upstream is not the proxy itself.",
)
_NO_CLIENT_KEY = (
    401,
    "invalid_api_key",
    "unauthorized",
    "Incorrect API key provided: use a client key issued for this proxy.",
)


def refusal(request: web.Request) -> web.StreamResponse | None:
    """Why a ``/v1/`` request is refused before its handler runs, if it is: its path leaves
    ``/v1/`` once normalized (``security.paths``); it carries our hop marker, so a proxy sent
    it and forwarding it again could go on forever (``security.self_forwarding``); or the
    proxy holds upstream keys and the request holds no client key."""
    refused = None
    if leaves_v1(request.raw_path):
        refused = _INVALID_PATH
    elif HOP_HEADER in request.headers:
        refused = _LOOP
    else:
        keys = request.app[SERVICES].client_keys
        if keys.required and not keys.allows(api_key_of(request.headers)):
            refused = _NO_CLIENT_KEY
    if refused is None:
        return None
    status, code, outcome, message = refused
    REQUESTS.labels(route="", outcome=outcome).inc()
    return error_response(status, message, code=code, wire=caller_format(request))


def guarded(handler: Handler) -> Handler:
    """``handler`` behind ``refusal``: every ``/v1/`` route is built with it.

    A wrapper per route rather than application middlewares: with any middleware at all,
    aiohttp runs every request, on every route, through the chain and through a middleware of
    its own that sets and restores the current app, three coroutines where one does."""

    async def checked(request: web.Request) -> web.StreamResponse:
        vouched = request.headers.get(LOOPBACK_CLIENT_HEADER)
        if vouched is not None:  # a WebSocket frame's request to this process, or a forgery
            address = request.app[SERVICES].loopback.address_in(vouched)
            if address is not None:
                request[CLIENT_ADDRESS] = address  # the access line's (on this request)
                request = request.clone(remote=address)
        refused = refusal(request)
        if refused is not None:
            return refused
        return await handler(request)

    return checked


def create_app(settings: Settings) -> web.Application:
    """Build the proxy. Invalid per-model policies, and keys that would go to the wrong host
    or not at all, fail here, before serving. The tokenizers' environment is set here, on the
    caller's thread, before start-up runs work on others (``use_bundled_tokenizers``)."""
    use_bundled_tokenizers()
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
    initialize_label_sets()
    initialize_route_series(route.model for route in settings.routes)
    loopback = LoopbackVouch.from_environment(os.environ)
    app.cleanup_ctx.append(_services_context(settings, client_keys, loopback))
    app.add_routes(
        [
            web.post("/v1/chat/completions", guarded(handlers.endpoint(CHAT))),
            web.post("/v1/responses", guarded(handlers.endpoint(RESPONSES))),
            web.post("/v1/messages", guarded(handlers.endpoint(MESSAGES))),
            # A WebSocket on a compacted endpoint: served frame by frame, or refused.
            *(
                web.get("/v1" + wire.upstream_path, guarded(socket_endpoint(wire)))
                for wire in (CHAT, RESPONSES, MESSAGES)
            ),
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
