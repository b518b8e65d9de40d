"""HTTP handlers: the imperative shell around the pure conversation model.

Request flow (docs/design.md §2): validate → route → tenant → chain → load state → derive the
surface → log → forward → record usage. Whatever fails in the store, the request is still
forwarded unchanged (``X-Compaction-Status: bypass``) and the upstream's answer reaches the
client byte for byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from compaction_proxy.compaction.model_policy import ModelPolicy
from compaction_proxy.compaction.pressure import answer_attributes
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import Route
from compaction_proxy.conversation.log_events import overflow_event, usage_event
from compaction_proxy.conversation.messages import is_valid_session_id
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.request import ClientRequest, ProviderHeld
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import bad_request_response, upstream_failed
from compaction_proxy.http.forwarding import Reply, forward, usage_of
from compaction_proxy.http.intake import check_headers, read_body
from compaction_proxy.http.ownership import bound_to_the_account, claimer, named_in_body
from compaction_proxy.http.passthrough import relay_as_sent
from compaction_proxy.http.upstream import buffered_response, client_headers, client_query
from compaction_proxy.metering.overflow import classify_overflow
from compaction_proxy.metering.windows import window_key
from compaction_proxy.metrics import (
    BYPASSES,
    CLIENT_DISCONNECTS,
    FORMAT_REQUESTS,
    METER_ERROR,
    OVERFLOW_RECOVERIES,
    PROMPT_TOKENS_FORWARDED,
    PROXY_OVERHEAD,
    REQUEST_DURATION,
    REQUESTS,
    child,
)
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.parsing.recent_bodies import Lineage
from compaction_proxy.security.object_references import NamedObject
from compaction_proxy.security.outbound import speaks_anthropic, upstream_headers, upstream_url
from compaction_proxy.service.forwarded import Forwarded, RequestStatus
from compaction_proxy.service.prepare import count_rereads, prepare
from compaction_proxy.service.record import RequestRecord, write_record
from compaction_proxy.service.recover import recover_overflow
from compaction_proxy.service.services import Services
from compaction_proxy.store import StoreUnavailable

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"


def _session_id(headers: Mapping[str, str], *names: str) -> str | None:
    """The conversation's name from the first of ``SESSION_HEADER`` and ``names`` sent."""
    for name in (SESSION_HEADER, *names):
        value = headers.get(name)
        if value is None:
            continue
        if not is_valid_session_id(value):
            raise BadRequest(
                f"Invalid {name} header: use at most 128 characters of [A-Za-z0-9._:-].",
                param=name,
                code="invalid_session_id",
            )
        return value
    return None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def endpoint(wire: WireFormat) -> Handler:
    """The handler of ``wire``'s endpoint (``POST /v1/chat/completions``, ``/v1/responses``,
    ``/v1/messages``): parsed by its adapter, compacted by the shared core, bad input answered
    in its family's error shape. A body whose history the provider holds (a Responses
    ``previous_response_id``) is forwarded as sent, and counted."""
    anthropic = wire.family is ApiFamily.ANTHROPIC

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        services = request.app[SERVICES]
        try:
            check_headers(request.headers)
            raw = await read_body(request, services.settings.max_body_bytes)
            session_id = _session_id(request.headers, *wire.session_headers)
            beta = tuple(request.headers.getall("anthropic-beta", ())) if anthropic else ()
            context = ParseContext(
                services.known_messages, services.recent_bodies, session_id, beta=beta
            )
            parsed = await off_loop_if(is_big(len(raw)), lambda: wire.parse(raw, context))
            if isinstance(parsed, ProviderHeld):
                named = await _named(request, raw, parsed.body)
                route = services.policies.for_model(parsed.model, wire.family).route
                REQUESTS.labels(route=route.model, outcome="stateful").inc()
                return await relay_as_sent(request, route, raw, named)
            named = await _named(request, raw, parsed.body, parsed.lineage)
        except BadRequest as error:
            REQUESTS.labels(route="", outcome="bad_request").inc()
            return bad_request_response(error, anthropic=anthropic)
        return await _serve(request, parsed, session_id, started, named)

    handle.__name__ = f"{wire.name}_endpoint"
    return handle


async def _named(
    request: web.Request, raw: bytes, body: Any, lineage: Lineage | None = None
) -> list[NamedObject]:
    """The stored objects the body names (``http.ownership.named_in_body``)."""
    return await off_loop_if(is_big(len(raw)), lambda: named_in_body(request, raw, body, lineage))


async def _serve(
    request: web.Request,
    client_request: ClientRequest,
    session_id: str | None,
    started: float,
    named: Sequence[NamedObject] = (),
) -> web.StreamResponse:
    """Bind to the account what names its objects; prepare (compact if need be), forward,
    recover from an overflow, record."""
    services = request.app[SERVICES]
    model_policy = services.policies.for_model(client_request.model, client_request.wire.family)
    route = model_policy.route
    refused = await bound_to_the_account(request, route, named)
    if refused is not None:
        outcome = "refused" if refused.status == 403 else "not_found"
        REQUESTS.labels(route=route.model, outcome=outcome).inc()
        return refused
    record: RequestRecord | None = None
    try:
        forwarded, record = await prepare(
            services,
            client_request,
            model_policy,
            session_id,
            request.headers,
            client_query(request),
        )
    except StoreUnavailable as exc:
        log.warning("store unavailable (%s): forwarding unchanged", exc.operation)
        BYPASSES.labels(route=route.model, cause="store").inc()
        forwarded = Forwarded.bypass(client_request.raw)
    except Exception:
        # Never worse than no proxy: a fault of our own sends the client's bytes as they came.
        log.exception("preparing the request failed: forwarding it unchanged")
        BYPASSES.labels(route=route.model, cause="error").inc()
        forwarded = Forwarded.bypass(client_request.raw)

    child(PROXY_OVERHEAD, route.model).observe(time.perf_counter() - started)
    in_flight = services.in_flight
    conversation = forwarded.conversation
    if conversation is not None:
        in_flight[conversation] += 1
    reply: Reply | None = None
    try:
        reply, forwarded = await _forward_with_recovery(
            request, client_request, model_policy, forwarded, record
        )
    finally:
        if conversation is not None:
            in_flight[conversation] -= 1
            if in_flight[conversation] <= 0:
                del in_flight[conversation]
        if record is not None:
            # Written once the client has its answer (the conversation's next request waits
            # for it); logged even when the client went away mid-answer.
            work = _record(services, forwarded, record, reply)
            services.pending_records.spawn(record.log.view.conversation, work)
        # Counted however the request ended, a client that left included.
        outcome = _outcome(reply, forwarded.status)
        child(REQUESTS, route.model, outcome).inc()
        child(FORMAT_REQUESTS, client_request.api, forwarded.status.value).inc()
        child(REQUEST_DURATION, route.model).observe(time.perf_counter() - started)
        if outcome == "client_disconnected":
            CLIENT_DISCONNECTS.labels(route=route.model).inc()
    return reply.response


async def _forward_with_recovery(
    request: web.Request,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    forwarded: Forwarded,
    record: RequestRecord | None,
) -> tuple[Reply, Forwarded]:
    """Forward; after a context overflow, compact and retry while the evidence allows."""
    services = request.app[SERVICES]
    route = model_policy.route
    reply = await _send(request, route, client_request, forwarded)
    retries = 0
    while reply.error_body is not None:
        verdict = classify_overflow(reply.status, reply.error_body)
        if not verdict.is_overflow:
            break
        if verdict.limit is not None:
            named = window_key(client_request.model, client_request.declared_window)
            services.learned_windows.learn(route.model, named, verdict.limit)
        retry, overflowed_at = None, time.time()
        if record is not None and retries < model_policy.policy.max_overflow_retries:
            retries += 1
            try:
                retry = await recover_overflow(
                    services, client_request, model_policy, forwarded, record
                )
            except Exception:
                log.exception("overflow recovery failed: the upstream's error stands")
        if record is not None:
            retried = retry is not None
            record.add(overflow_event(now=overflowed_at, limit=verdict.limit, retried=retried))
            if retry is not None:
                record.add_forwarded(retry, client_request.model, route.model, time.time())
        if retry is None:
            OVERFLOW_RECOVERIES.labels(result="passed_through").inc()
            break
        OVERFLOW_RECOVERIES.labels(result="retried").inc()
        forwarded = retry
        reply = await _send(request, route, client_request, forwarded)
    return reply, forwarded


async def _send(
    request: web.Request, route: Route, client_request: ClientRequest, forwarded: Forwarded
) -> Reply:
    if forwarded.measurement is not None:
        child(PROMPT_TOKENS_FORWARDED, route.model).inc(forwarded.measurement.tokens)
    headers = forwarded.compaction_headers()
    # Owned mode: what the provider keeps of the answer is the caller's.
    claim = claimer(request, route) if client_request.stored else None
    wire = client_request.wire
    anthropic = wire.family is ApiFamily.ANTHROPIC
    return await forward(
        request, route, wire.upstream_path, forwarded.payload, headers, claim, anthropic=anthropic
    )


def _outcome(reply: Reply | None, status: RequestStatus) -> str:
    if reply is not None and reply.upstream_cut:
        return "upstream_error"
    if reply is None or reply.client_gone:
        return "client_disconnected"
    upstream_status = reply.status
    if upstream_status == 0:
        return "upstream_unavailable"
    if upstream_status >= 400:
        return "upstream_error"
    return "bypass" if status is RequestStatus.BYPASS else "ok"


async def _record(
    services: Services, forwarded: Forwarded, record: RequestRecord, reply: Reply | None
) -> None:
    """The request's second round trip: its messages, what was forwarded, the upstream's
    usage, the anchor (see ``service.record``)."""
    anchor = None
    await count_rereads(forwarded)
    usage = await usage_of(reply) if reply is not None else None
    if reply is not None and usage is not None:
        record.add(usage_event(now=time.time(), usage=usage, status=reply.status))
        record.set(answer_attributes(forwarded.state, usage))
        prompt_tokens = usage.get("prompt_tokens")
        measurement = forwarded.measurement
        if measurement is not None and isinstance(prompt_tokens, int) and prompt_tokens > 0:
            anchor = measurement.anchor_for(prompt_tokens)
            if not measurement.anchored:
                METER_ERROR.observe((measurement.tokens - prompt_tokens) / prompt_tokens)
                model = record.log.view.model
                services.engine.meter.calibrate(model, measurement.estimated, prompt_tokens)
    # A lost record is counted by the instrumented store; not worth failing a request.
    try:
        await write_record(services.store, services.settings, record, anchor)
    except StoreUnavailable:
        pass
    except Exception:
        log.exception("recording the request failed")


async def list_models(request: web.Request) -> web.StreamResponse:
    """``GET /v1/models``: the default route's list, or, asked by an Anthropic client, the
    Anthropic upstream's (in its shape)."""
    settings = request.app[SERVICES].settings
    anthropic = speaks_anthropic(request.path, request.headers)
    route = settings.anthropic_route if anthropic else settings.default_route
    session = request.app[SERVICES].http_client
    proxy_keys = request.app[SERVICES].client_keys.required
    headers = upstream_headers(
        request.headers, route.api_key_env, proxy_keys=proxy_keys, anthropic=anthropic
    )
    try:
        url = upstream_url(route.base, "/models", client_query(request))
        async with session.get(url, headers=headers, allow_redirects=False) as upstream:
            body = await upstream.read()
            return buffered_response(upstream.status, client_headers(upstream), body)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return upstream_failed(route.base, exc, anthropic=anthropic)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await request.app[SERVICES].store.ping()
    except StoreUnavailable:
        return web.json_response({"status": "unavailable", "store": "down"}, status=503)
    return web.json_response({"status": "ready", "store": "up"})
