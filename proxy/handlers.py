"""HTTP handlers: the imperative shell around the pure conversation model.

Request flow (docs/design.md §2): validate → route → tenant → chain → load state → derive the
surface → log → forward → record usage. Whatever fails in the store, the request is still
forwarded unchanged (``X-Compaction-Status: bypass``) and the upstream's answer reaches the
client byte for byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.chat_request import ChatRequest, parse_chat_request
from proxy.config import Route
from proxy.conversation import (
    Message,
    chain_hashes,
    chain_root,
    conversation_id,
    derive_surface,
    is_valid_session_id,
    split_head,
)
from proxy.errors import BadRequest, bad_request_response, error_response
from proxy.events import first_unlogged, message_events, request_event, usage_event
from proxy.keys import HTTP_CLIENT, SETTINGS, STORE, TENANT_SECRET
from proxy.metrics import PROXY_OVERHEAD, REQUEST_DURATION, REQUESTS, STORE_ERRORS
from proxy.policy import route_for
from proxy.store import StoreUnavailable
from proxy.tenant import api_key_of, tenant_of
from proxy.upstream import (
    UsageScanner,
    buffered_response,
    client_headers,
    is_event_stream,
    relay_stream,
    upstream_headers,
    usage_of_body,
)

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"


async def _read_body(request: web.Request, limit: int) -> bytes:
    too_large = BadRequest(
        f"Request body too large: the limit is {limit} bytes.",
        status=413,
        code="request_too_large",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large from exc
    if len(raw) > limit:
        raise too_large
    return raw


def _session_id(headers: Mapping[str, str]) -> str | None:
    value = headers.get(SESSION_HEADER)
    if value is None:
        return None
    if not is_valid_session_id(value):
        raise BadRequest(
            f"Invalid {SESSION_HEADER} header: use at most 128 characters of [A-Za-z0-9._:-].",
            param=SESSION_HEADER,
            code="invalid_session_id",
        )
    return value


@dataclass
class Prepared:
    """What to forward, and what to remember about it afterwards."""

    payload: bytes
    status: str
    conversation: str | None = None
    generation: int | None = None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    settings = request.app[SETTINGS]
    try:
        raw = await _read_body(request, settings.max_body_bytes)
        chat = parse_chat_request(raw)
        session_id = _session_id(request.headers)
    except BadRequest as error:
        REQUESTS.labels(route="", outcome="bad_request").inc()
        return bad_request_response(error)

    route = route_for(settings, chat.model)
    try:
        prepared = await _prepare(request, chat, raw, route, session_id)
    except StoreUnavailable as exc:
        STORE_ERRORS.labels(operation=exc.operation).inc()
        log.warning("store unavailable (%s): forwarding unchanged", exc.operation)
        prepared = Prepared(payload=raw, status="bypass")

    headers = {"X-Compaction-Status": prepared.status}
    if prepared.conversation is not None:
        headers["X-Compaction-Conversation"] = prepared.conversation
    if prepared.generation is not None:
        headers["X-Compaction-Generation"] = str(prepared.generation)
    PROXY_OVERHEAD.labels(route=route.model).observe(time.perf_counter() - started)

    response, upstream_status, usage = await _forward(request, route, prepared.payload, headers)
    REQUESTS.labels(route=route.model, outcome=_outcome(upstream_status, prepared.status)).inc()
    REQUEST_DURATION.labels(route=route.model).observe(time.perf_counter() - started)
    if prepared.conversation is not None and usage is not None:
        await _record_usage(request, prepared.conversation, usage, upstream_status)
    return response


def _outcome(upstream_status: int, status: str) -> str:
    if upstream_status == 0:
        return "upstream_unavailable"
    if upstream_status >= 400:
        return "upstream_error"
    return "bypass" if status == "bypass" else "ok"


async def _prepare(
    request: web.Request,
    chat: ChatRequest,
    raw: bytes,
    route: Route,
    session_id: str | None,
) -> Prepared:
    """Log the request and derive the surface to forward. Raises StoreUnavailable."""
    app = request.app
    settings, store = app[SETTINGS], app[STORE]
    tenant = tenant_of(await app[TENANT_SECRET].get(), api_key_of(request.headers))
    head, body = split_head(chat.messages)
    root = chain_root(tenant)
    chain = chain_hashes(root, body)
    conversation = conversation_id(tenant, root, chain, session_id)

    state = await store.load(conversation)
    surface = derive_surface(head, body, chain, root, state.records)
    status = "none"
    now = time.time()
    new_messages = message_events(
        body,
        chain,
        first_unlogged(chain, state.logged_tip),
        log_content=settings.log_content,
        now=now,
    )
    forwarded = request_event(
        now=now,
        model=chat.model,
        route=route.model,
        generation=state.generation,
        body_length=len(body),
        surface_length=len(surface.nodes),
        estimated_tokens=None,
        status=status,
    )
    await store.append(
        conversation,
        new_messages,
        [forwarded],
        attributes={"tenant": tenant, "last_seen": f"{now:.3f}", "model": chat.model},
    )
    payload = _payload(chat, surface.messages) if surface.changed else raw
    return Prepared(payload, status, conversation, state.generation)


def _payload(chat: ChatRequest, messages: list[Message]) -> bytes:
    """The client's body with only ``messages`` replaced; every other field as sent."""
    return orjson.dumps({**chat.body, "messages": messages})


async def _record_usage(
    request: web.Request, conversation: str, usage: dict[str, Any], upstream_status: int
) -> None:
    event = usage_event(now=time.time(), usage=usage, status=upstream_status)
    try:
        await request.app[STORE].record_usage(conversation, [event], None)
    except StoreUnavailable as exc:
        STORE_ERRORS.labels(operation=exc.operation).inc()


async def _forward(
    request: web.Request, route: Route, payload: bytes, extra_headers: Mapping[str, str]
) -> tuple[web.StreamResponse, int, dict[str, Any] | None]:
    """Send ``payload`` upstream and relay the answer. Returns the response, the upstream
    status (0 when it could not be reached) and the usage it reported, if any."""
    session = request.app[HTTP_CLIENT]
    headers = upstream_headers(request.headers, route.api_key_env)
    headers.setdefault("Content-Type", "application/json")
    url = f"{route.base}/chat/completions"
    try:
        async with session.post(url, data=payload, headers=headers) as upstream:
            reply_headers = client_headers(upstream)
            reply_headers.update(extra_headers)
            if upstream.status < 400 and is_event_stream(upstream):
                scanner = UsageScanner()
                streamed = await relay_stream(request, upstream, reply_headers, scanner)
                return streamed, upstream.status, scanner.usage
            body = await upstream.read()
            usage = usage_of_body(body) if upstream.status < 400 else None
            return buffered_response(upstream.status, reply_headers, body), upstream.status, usage
    except TimeoutError:
        log.warning("upstream %s timed out", route.base)
        timeout = error_response(
            504,
            "The upstream did not answer in time.",
            error_type="upstream_error",
            code="upstream_timeout",
        )
        return timeout, 0, None
    except aiohttp.ClientError as exc:
        log.warning("upstream %s failed: %s", route.base, type(exc).__name__)
        unreachable = error_response(
            502,
            f"The upstream could not be reached: {type(exc).__name__}.",
            error_type="upstream_error",
            code="upstream_unavailable",
        )
        return unreachable, 0, None


async def list_models(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    route = settings.default_route
    session = request.app[HTTP_CLIENT]
    headers = upstream_headers(request.headers, route.api_key_env)
    try:
        async with session.get(f"{route.base}/models", headers=headers) as upstream:
            body = await upstream.read()
            return buffered_response(upstream.status, client_headers(upstream), body)
    except (TimeoutError, aiohttp.ClientError) as exc:
        log.warning("upstream %s failed: %s", route.base, type(exc).__name__)
        return error_response(
            502,
            "The upstream could not be reached.",
            error_type="upstream_error",
            code="upstream_unavailable",
        )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await request.app[STORE].ping()
    except StoreUnavailable:
        STORE_ERRORS.labels(operation="ping").inc()
        return web.json_response({"status": "unavailable", "store": "down"}, status=503)
    return web.json_response({"status": "ready", "store": "up"})
