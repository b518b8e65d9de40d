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

import aiohttp
from aiohttp import web

from proxy.ahead import answer_attributes
from proxy.chat_request import parse_chat_request
from proxy.client_request import ClientRequest
from proxy.config import Route
from proxy.conversation import is_valid_session_id
from proxy.errors import BadRequest, bad_request_response, upstream_failed
from proxy.events import overflow_event, usage_event
from proxy.forwarding import Reply, forward, usage_of
from proxy.intake import check_headers, read_body
from proxy.keys import (
    CLIENT_KEYS,
    HTTP_CLIENT,
    IN_FLIGHT,
    KNOWN_MESSAGES,
    LEARNED_WINDOWS,
    PENDING_RECORDS,
    POLICIES,
    RECENT_BODIES,
    SETTINGS,
    STORE,
)
from proxy.metrics import (
    BYPASSES,
    CLIENT_DISCONNECTS,
    METER_ERROR,
    OVERFLOW_RECOVERIES,
    PROMPT_TOKENS_FORWARDED,
    PROXY_OVERHEAD,
    REQUEST_DURATION,
    REQUESTS,
    child,
)
from proxy.offload import is_big, off_loop_if
from proxy.overflow import classify_overflow
from proxy.passthrough import relay_as_sent
from proxy.policy import ModelPolicy
from proxy.preparation import Prepared, prepare
from proxy.recovery import recover_overflow
from proxy.request_log import record
from proxy.responses_request import parse_responses_body, parse_responses_request, stateful
from proxy.store import StoreUnavailable
from proxy.upstream import (
    buffered_response,
    client_headers,
    client_query,
    upstream_headers,
    upstream_url,
)

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"


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
    """``POST /v1/chat/completions``."""
    started = time.perf_counter()
    try:
        check_headers(request.headers)
        raw = await read_body(request, request.app[SETTINGS].max_body_bytes)
        session_id = _session_id(request.headers)
        known, recent = request.app[KNOWN_MESSAGES], request.app[RECENT_BODIES]
        client_request = await off_loop_if(
            is_big(len(raw)), lambda: parse_chat_request(raw, known, recent, session_id)
        )
    except BadRequest as error:
        REQUESTS.labels(route="", outcome="bad_request").inc()
        return bad_request_response(error)
    return await _serve(request, client_request, session_id, started)


async def responses(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses``: compacted like chat, unless the provider holds the history
    (``previous_response_id``, ``conversation``): then forwarded as sent, and counted."""
    started = time.perf_counter()
    try:
        check_headers(request.headers)
        raw = await read_body(request, request.app[SETTINGS].max_body_bytes)
        session_id = _session_id(request.headers)
        known, recent = request.app[KNOWN_MESSAGES], request.app[RECENT_BODIES]
        body, extension = await off_loop_if(
            is_big(len(raw)), lambda: parse_responses_body(raw, recent, session_id)
        )
        if stateful(body):
            route = request.app[POLICIES].for_model(body["model"]).route
            REQUESTS.labels(route=route.model, outcome="stateful").inc()
            return await relay_as_sent(request, route, raw)
        client_request = await off_loop_if(
            is_big(len(raw)),
            lambda: parse_responses_request(body, raw, known, recent, extension, session_id),
        )
    except BadRequest as error:
        REQUESTS.labels(route="", outcome="bad_request").inc()
        return bad_request_response(error)
    return await _serve(request, client_request, session_id, started)


async def _serve(
    request: web.Request,
    client_request: ClientRequest,
    session_id: str | None,
    started: float,
) -> web.StreamResponse:
    """Prepare (compact if need be), forward, recover from an overflow, record."""
    app = request.app
    model_policy = app[POLICIES].for_model(client_request.model)
    route = model_policy.route
    try:
        prepared = await prepare(request, client_request, model_policy, session_id)
    except StoreUnavailable as exc:
        log.warning("store unavailable (%s): forwarding unchanged", exc.operation)
        BYPASSES.labels(route=route.model, cause="store").inc()
        prepared = Prepared(payload=client_request.raw, status="bypass")
    except Exception:
        # Never worse than no proxy: a fault of our own sends the client's bytes as they came.
        log.exception("preparing the request failed: forwarding it unchanged")
        BYPASSES.labels(route=route.model, cause="error").inc()
        prepared = Prepared(payload=client_request.raw, status="bypass")

    child(PROXY_OVERHEAD, route.model).observe(time.perf_counter() - started)
    in_flight = app[IN_FLIGHT]
    conversation = prepared.conversation
    if conversation is not None:
        in_flight[conversation] += 1
    reply: Reply | None = None
    try:
        reply, prepared = await _forward_with_recovery(
            request, client_request, model_policy, prepared
        )
    finally:
        if conversation is not None:
            in_flight[conversation] -= 1
            if in_flight[conversation] <= 0:
                del in_flight[conversation]
            # Written once the client has its answer (the conversation's next request waits
            # for it); logged even when the client went away mid-answer.
            app[PENDING_RECORDS].spawn(conversation, _record(request.app, prepared, reply))
        # Counted however the request ended, a client that left included.
        outcome = _outcome(reply, prepared.status)
        child(REQUESTS, route.model, outcome).inc()
        child(REQUEST_DURATION, route.model).observe(time.perf_counter() - started)
        if outcome == "client_disconnected":
            CLIENT_DISCONNECTS.labels(route=route.model).inc()
    return reply.response


async def _forward_with_recovery(
    request: web.Request,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    prepared: Prepared,
) -> tuple[Reply, Prepared]:
    """Forward; after a context overflow, compact and retry while the evidence allows."""
    app = request.app
    route = model_policy.route
    reply = await _send(request, route, client_request.upstream_path, prepared)
    retries = 0
    while reply.error_body is not None:
        verdict = classify_overflow(reply.status, reply.error_body)
        if not verdict.is_overflow:
            break
        if verdict.limit is not None:
            app[LEARNED_WINDOWS].learn(route.model, client_request.model, verdict.limit)
        retry = None
        overflow = overflow_event(now=time.time(), limit=verdict.limit, retried=False)
        prepared.pending_events.append(overflow)  # a retry carries it on, before its own
        if retries < model_policy.policy.max_overflow_retries:
            retries += 1
            try:
                retry = await recover_overflow(request, client_request, model_policy, prepared)
            except Exception:
                log.exception("overflow recovery failed: the upstream's error stands")
        overflow["retried"] = retry is not None
        if retry is None:
            OVERFLOW_RECOVERIES.labels(result="passed_through").inc()
            break
        OVERFLOW_RECOVERIES.labels(result="retried").inc()
        prepared = retry
        reply = await _send(request, route, client_request.upstream_path, prepared)
    return reply, prepared


async def _send(request: web.Request, route: Route, path: str, prepared: Prepared) -> Reply:
    if prepared.measurement is not None:
        child(PROMPT_TOKENS_FORWARDED, route.model).inc(prepared.measurement.tokens)
    headers = _compaction_headers(prepared)
    return await forward(request, route, path, prepared.payload, headers)


def _compaction_headers(prepared: Prepared) -> dict[str, str]:
    headers = {"X-Compaction-Status": prepared.status}
    if prepared.conversation is not None:
        headers["X-Compaction-Conversation"] = prepared.conversation
    if prepared.generation is not None:
        headers["X-Compaction-Generation"] = str(prepared.generation)
    if prepared.measurement is not None:
        headers["X-Compaction-Tokens"] = str(prepared.measurement.tokens)
    if prepared.tokens_before is not None:
        headers["X-Compaction-Tokens-Before"] = str(prepared.tokens_before)
    return headers


def _outcome(reply: Reply | None, status: str) -> str:
    if reply is None or reply.client_gone:
        return "client_disconnected"
    upstream_status = reply.status
    if upstream_status == 0:
        return "upstream_unavailable"
    if upstream_status >= 400:
        return "upstream_error"
    return "bypass" if status == "bypass" else "ok"


async def _record(app: web.Application, prepared: Prepared, reply: Reply | None) -> None:
    """The request's second round trip: its messages, what was forwarded, the upstream's
    usage, the anchor (see ``proxy.request_log``)."""
    assert prepared.conversation is not None and prepared.log is not None
    events = list(prepared.pending_events)
    attributes = dict(prepared.pending_attributes)
    anchor = None
    usage = await usage_of(reply) if reply is not None else None
    if reply is not None and usage is not None:
        events.append(usage_event(now=time.time(), usage=usage, status=reply.status))
        attributes.update(answer_attributes(prepared.state, usage))
        prompt_tokens = usage.get("prompt_tokens")
        measurement = prepared.measurement
        if measurement is not None and isinstance(prompt_tokens, int) and prompt_tokens > 0:
            anchor = measurement.anchor_for(prompt_tokens)
            if not measurement.anchored:
                METER_ERROR.observe((measurement.estimated - prompt_tokens) / prompt_tokens)
    # A lost record is counted by the instrumented store; not worth failing a request.
    try:
        await record(app[STORE], app[SETTINGS], prepared.log, events, anchor, attributes)
    except StoreUnavailable:
        pass
    except Exception:
        log.exception("recording the request failed")


async def list_models(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    route = settings.default_route
    session = request.app[HTTP_CLIENT]
    proxy_keys = request.app[CLIENT_KEYS].required
    headers = upstream_headers(request.headers, route.api_key_env, proxy_keys=proxy_keys)
    try:
        url = upstream_url(route.base, "/models", client_query(request))
        async with session.get(url, headers=headers, allow_redirects=False) as upstream:
            body = await upstream.read()
            return buffered_response(upstream.status, client_headers(upstream), body)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return upstream_failed(route.base, exc)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await request.app[STORE].ping()
    except StoreUnavailable:
        return web.json_response({"status": "unavailable", "store": "down"}, status=503)
    return web.json_response({"status": "ready", "store": "up"})
