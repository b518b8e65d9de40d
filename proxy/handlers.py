"""HTTP handlers: the imperative shell around the pure conversation model."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import aiohttp
import orjson
from aiohttp import web

from proxy.chat_request import ChatRequest, parse_chat_request
from proxy.config import Route
from proxy.conversation import (
    chain_hashes,
    chain_root,
    conversation_id,
    derive_surface,
    is_valid_session_id,
    split_head,
)
from proxy.errors import BadRequest, bad_request_response, error_response
from proxy.keys import HTTP_CLIENT, SETTINGS, TENANT_SECRET
from proxy.policy import route_for
from proxy.tenant import api_key_of, tenant_of
from proxy.upstream import (
    UsageScanner,
    buffered_response,
    client_headers,
    is_event_stream,
    relay_stream,
    upstream_headers,
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


async def chat_completions(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    try:
        raw = await _read_body(request, settings.max_body_bytes)
        chat = parse_chat_request(raw)
        session_id = _session_id(request.headers)
    except BadRequest as error:
        return bad_request_response(error)

    route = route_for(settings, chat.model)
    tenant = tenant_of(request.app[TENANT_SECRET], api_key_of(request.headers))
    head, body = split_head(chat.messages)
    root = chain_root(tenant)
    chain = chain_hashes(root, body)
    conversation = conversation_id(tenant, root, chain, session_id)
    surface = derive_surface(head, body, chain, root, records=())

    payload = _payload(chat, surface.messages) if surface.changed else raw
    extra = {"X-Compaction-Conversation": conversation, "X-Compaction-Status": "none"}
    return await _forward(request, route, payload, extra)


def _payload(chat: ChatRequest, messages: list[dict[str, object]]) -> bytes:
    """The client's body with only ``messages`` replaced; every other field as sent."""
    return orjson.dumps({**chat.body, "messages": messages})


async def _forward(
    request: web.Request, route: Route, payload: bytes, extra_headers: Mapping[str, str]
) -> web.StreamResponse:
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
                return await relay_stream(request, upstream, reply_headers, scanner)
            body = await upstream.read()
            return buffered_response(upstream.status, reply_headers, body)
    except TimeoutError:
        log.warning("upstream %s timed out", route.base)
        return error_response(
            504,
            "The upstream did not answer in time.",
            error_type="upstream_error",
            code="upstream_timeout",
        )
    except aiohttp.ClientError as exc:
        log.warning("upstream %s failed: %s", route.base, type(exc).__name__)
        return error_response(
            502,
            f"The upstream could not be reached: {type(exc).__name__}.",
            error_type="upstream_error",
            code="upstream_unavailable",
        )


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
    return web.json_response({"status": "ready"})
