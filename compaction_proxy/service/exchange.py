"""The life of a compacted request, from its parsed body to its log entry: the service's one entry.

The edge parses the body with its ``WireFormat``, authenticates, and hands the request here
with a ``ClientLink``, its side of the exchange: the client's headers and query, the
ownership check of the objects the body names, and the sending of an attempt (through the
``upstream_seam``, relaying a successful stream to the client as it arrives). From there the
service decides: the policy is resolved once, the request prepared (compacted if need be),
sent, recovered from a context overflow while the evidence allows, counted, and recorded
after the client has its answer. Whatever fails in preparation, the client's bytes go as they
came (``X-Compaction-Status: bypass``): never worse than no proxy.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from compaction_proxy.compaction.model_policy import ModelPolicy
from compaction_proxy.compaction.pressure import answer_attributes
from compaction_proxy.config.native_compaction import serves_compaction
from compaction_proxy.config.settings import Route
from compaction_proxy.conversation.log_events import overflow_event, usage_event
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.usage import prompt_cache_use, usage_of_body
from compaction_proxy.formats.wire import ParseContext
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.overflow import classify_overflow
from compaction_proxy.metering.windows import window_key
from compaction_proxy.metrics import (
    BYPASSES,
    CLIENT_DISCONNECTS,
    FORMAT_REQUESTS,
    METER_ERROR,
    OVERFLOW_RECOVERIES,
    PROMPT_CACHE_KINDS,
    PROMPT_TOKENS_FORWARDED,
    PROXY_OVERHEAD,
    REQUEST_DURATION,
    REQUESTS,
    UPSTREAM_PROMPT_TOKENS,
    child,
)
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.security.object_references import NamedObject
from compaction_proxy.service.forwarded import Forwarded, RequestStatus
from compaction_proxy.service.native_compaction import MadeAnswer, NativeCompaction
from compaction_proxy.service.prepare import count_rereads, prepare
from compaction_proxy.service.recover import retry_after_overflow
from compaction_proxy.service.request_log import RequestLogEntry, write_request_log
from compaction_proxy.service.services import Services
from compaction_proxy.service.without_store import known_tenant, relieved_without_store
from compaction_proxy.store import StoreUnavailable

log = logging.getLogger(__name__)

Response = TypeVar("Response")  # what the edge answers its client with
AnswerBegan = Callable[[int], None]  # told the upstream's status as its answer begins


@frozen
class Reply(Generic[Response]):
    """One attempt's outcome: the client's response (the edge's), the upstream status (0:
    unreachable), the usage a stream reported or the whole answer it is to be read from
    (``usage_of``), and the raw error body when the upstream answered with an error (not yet
    sent: the service may still retry)."""

    response: Response
    status: int
    usage: dict[str, Any] | None = None
    error_body: bytes | None = None
    client_gone: bool = False  # the client left before its answer was whole
    upstream_cut: bool = False  # the upstream broke off a stream already being relayed
    answer: bytes | None = None  # a successful answer sent whole


@frozen
class Refusal(Generic[Response]):
    """The client's answer when the body names an object its account may not reach."""

    response: Response
    outcome: str  # ``refused`` or ``not_found``: the requests counter's outcome


class ClientLink(Protocol[Response]):
    """The edge's side of one request (``http.forwarding.EdgeLink``)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def query(self) -> str:
        """The client's query string as it encoded it ("" for none)."""
        ...

    async def refusal(self, route: Route, named: Sequence[NamedObject]) -> Refusal[Response] | None:
        """A refusal when the body names another account's object (``http.ownership``)."""
        ...

    async def send(
        self,
        route: Route,
        client_request: ClientRequest,
        forwarded: Forwarded,
        answer_began: AnswerBegan | None = None,
    ) -> Reply[Response]:
        """Send one attempt upstream; a successful answer reaches the client, an error is
        returned unsent. ``answer_began`` is called with the upstream's status as soon as it
        is known, before any of the answer is relayed."""
        ...

    def made_here(self, answer: MadeAnswer) -> Response:
        """An answer the proxy made itself (``service.native_compaction``)."""
        ...


async def usage_of(reply: Reply[Any]) -> dict[str, Any] | None:
    """The usage the upstream reported: a stream's as it was relayed, a whole answer's read
    from it. Asked after the client has its answer, so reading it costs the client nothing."""
    if reply.answer is None:
        return reply.usage
    answer = reply.answer
    return await off_loop_if(is_big(len(answer)), lambda: usage_of_body(answer))


async def serve(
    services: Services,
    link: ClientLink[Response],
    client_request: ClientRequest,
    session_id: str | None,
    started: float,
    named: Sequence[NamedObject] = (),
) -> Response:
    """Bind to the account what names its objects; prepare (compact if need be), forward,
    recover from an overflow, write its log entry. ``started``: when the edge began reading
    the request."""
    model_policy = services.policies.for_model(client_request.model, client_request.wire.family)
    route = model_policy.route
    refused = await link.refusal(route, named)
    if refused is not None:
        REQUESTS.labels(route=route.model, outcome=refused.outcome).inc()
        return refused.response
    if client_request.wire.asks_for_compaction(client_request.body) and serves_compaction(route):
        native = NativeCompaction(
            services, client_request, model_policy, session_id, link.headers, link.query
        )
        answer = await native.trigger_answer()
        outcome = "compacted" if answer.status == 200 else "compaction_unavailable"
        REQUESTS.labels(route=route.model, outcome=outcome).inc()
        return link.made_here(answer)
    asked = client_request.wire.asked_compaction(client_request.body)
    if asked is not None and not serves_compaction(route):
        asked = None  # the upstream has the option: it goes as sent
    if asked is not None:  # the upstream has no such option: it never sees it
        client_request = await _without_option(services, client_request, session_id)
    log_entry: RequestLogEntry | None = None
    try:
        if asked is not None:
            native = NativeCompaction(
                services, client_request, model_policy, session_id, link.headers, link.query
            )
            forwarded, log_entry, made_here = await native.prepared_as_asked(asked)
            if made_here is not None:
                REQUESTS.labels(route=route.model, outcome="compacted").inc()
                return link.made_here(made_here)
        else:
            forwarded, log_entry = await prepare(
                services, client_request, model_policy, session_id, link.headers, link.query
            )
    except StoreUnavailable as exc:
        log.warning("store unavailable (%s): relieved from the request alone", exc.operation)
        forwarded = await _without_store(services, link, client_request, model_policy, session_id)
        if forwarded.status is RequestStatus.BYPASS:
            BYPASSES.labels(route=route.model, cause="store").inc()
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
    reply: Reply[Response] | None = None
    sent = forwarded
    try:
        reply, forwarded = await _forward_with_recovery(
            services, link, client_request, model_policy, forwarded, log_entry, session_id
        )
    finally:
        resolve_prompt_answered(sent, forwarded, reply)
        if conversation is not None:
            in_flight[conversation] -= 1
            if in_flight[conversation] <= 0:
                del in_flight[conversation]
        if log_entry is not None:
            # Written once the client has its answer (the conversation's next request waits
            # for it); logged even when the client went away mid-answer.
            work = _write_log(services, forwarded, log_entry, reply, route.model)
            services.pending_log_writes.spawn(log_entry.log.view.conversation, work)
        # Counted however the request ended, a client that left included.
        outcome = _outcome(reply, forwarded.status)
        child(REQUESTS, route.model, outcome).inc()
        child(FORMAT_REQUESTS, client_request.api, forwarded.status).inc()
        child(REQUEST_DURATION, route.model).observe(time.perf_counter() - started)
        if outcome == "client_disconnected":
            CLIENT_DISCONNECTS.labels(route=route.model).inc()
    return reply.response


def prompt_answer_began(sent: Forwarded) -> AnswerBegan | None:
    """What resolves the ``prompt_answered`` of a round prepared beside this request once the
    answer to the prompt as first sent begins: true for a 2xx. Anthropic reads a prefix once
    the answer to the prompt that wrote it has begun, so the round's summary call need not
    wait for the end of a long streamed answer. None when no round waits."""
    answered = sent.job.prompt_answered if sent.job is not None else None
    if answered is None:
        return None

    def began(status: int) -> None:
        if not answered.done():
            answered.set_result(200 <= status < 300)

    return began


def resolve_prompt_answered(sent: Forwarded, last: Forwarded, reply: Reply[Any] | None) -> None:
    """Resolve the ``prompt_answered`` of a round prepared beside this request, if its answer
    never began (``prompt_answer_began``): whether the prompt it was started from was answered
    (not refused, nor replaced by a retry)."""
    began = prompt_answer_began(sent)
    if began is not None:  # a status no answer has when there was none to the prompt sent
        began(reply.status if reply is not None and last is sent else 0)


async def _without_option(
    services: Services, client_request: ClientRequest, session_id: str | None
) -> ClientRequest:
    """``client_request`` without the compaction option the proxy serves for it."""
    wire = client_request.wire
    big = is_big(len(client_request.raw))
    raw = await off_loop_if(big, lambda: wire.without_asked_compaction(client_request))
    context = ParseContext(services.known_messages, services.recent_bodies, session_id)
    parsed = await off_loop_if(big, lambda: wire.parse(raw, context))
    assert isinstance(parsed, ClientRequest)  # a body the provider holds never comes here
    return parsed


async def _without_store(
    services: Services,
    link: ClientLink[Response],
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
) -> Forwarded:
    """The store out of reach: relieved from the request alone, else as it came."""
    try:
        return await relieved_without_store(
            services, client_request, model_policy, session_id, link.headers, link.query
        )
    except Exception:
        log.exception("relieving a request without the store failed: forwarding it unchanged")
        return Forwarded.bypass(client_request.raw)


async def _forward_with_recovery(
    services: Services,
    link: ClientLink[Response],
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    forwarded: Forwarded,
    log_entry: RequestLogEntry | None,
    session_id: str | None,
) -> tuple[Reply[Response], Forwarded]:
    """Forward; after a context overflow, compact and retry while the evidence allows. With
    the store out of reach (no ``log_entry``), the overflow may have taught the window (its
    stated limit): the request is relieved again from its own history, and retried only when
    that changed what goes."""
    route = model_policy.route
    began = prompt_answer_began(forwarded)  # the first attempt's answer only
    reply = await _send(link, route, client_request, forwarded, began)
    retries = 0
    while reply.error_body is not None:
        verdict = classify_overflow(reply.status, reply.error_body)
        if not verdict.is_overflow:
            break
        if verdict.limit is not None:
            tenant = await _tenant_of(services, forwarded, link.headers)
            if tenant is not None:  # the limit is that tenant's to learn (LearnedWindows)
                named = window_key(client_request.model, client_request.declared_window)
                services.learned_windows.learn(route.model, tenant, named, verdict.limit)
        retry, overflowed_at = None, time.time()
        if retries < model_policy.policy.max_overflow_retries:
            retries += 1
            try:
                if log_entry is not None:
                    retry = await retry_after_overflow(
                        services, client_request, model_policy, forwarded, log_entry
                    )
                else:
                    retry = await _relieved_again(
                        services, link, client_request, model_policy, forwarded, session_id
                    )
            except Exception:
                log.exception("overflow recovery failed: the upstream's error stands")
        if log_entry is not None:
            retried = retry is not None
            log_entry.add(overflow_event(now=overflowed_at, limit=verdict.limit, retried=retried))
            if retry is not None:
                log_entry.add_forwarded(retry, client_request.model, route.model, time.time())
        if retry is None:
            OVERFLOW_RECOVERIES.labels(result="passed_through").inc()
            break
        OVERFLOW_RECOVERIES.labels(result="retried").inc()
        forwarded = retry
        reply = await _send(link, route, client_request, forwarded)
    return reply, forwarded


async def _tenant_of(
    services: Services, forwarded: Forwarded, client_headers: Mapping[str, str]
) -> str | None:
    """The caller's tenant: its request view's, else (store out of reach) from the secret."""
    if forwarded.job is not None:
        return forwarded.job.view.tenant
    return await known_tenant(services, client_headers)


async def _relieved_again(
    services: Services,
    link: ClientLink[Response],
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    failed: Forwarded,
    session_id: str | None,
) -> Forwarded | None:
    """After an overflow with the store out of reach: the request relieved from its own
    history again (the window it may have taught is known now); None when that sends the same
    bytes, which the upstream has just refused."""
    again = await _without_store(services, link, client_request, model_policy, session_id)
    if again.payload == failed.payload:
        return None
    return dataclasses.replace(again, status=RequestStatus.RECOVERED)


async def _send(
    link: ClientLink[Response],
    route: Route,
    client_request: ClientRequest,
    forwarded: Forwarded,
    answer_began: AnswerBegan | None = None,
) -> Reply[Response]:
    if forwarded.measurement is not None:
        child(PROMPT_TOKENS_FORWARDED, route.model).inc(forwarded.measurement.tokens)
    return await link.send(route, client_request, forwarded, answer_began)


def _outcome(reply: Reply[Any] | None, status: RequestStatus) -> str:
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


async def _write_log(
    services: Services,
    forwarded: Forwarded,
    log_entry: RequestLogEntry,
    reply: Reply[Any] | None,
    route: str,
) -> None:
    """The request's second round trip: its messages, what was forwarded, the upstream's
    usage, the anchor (see ``service.request_log``); and what the upstream's cache did with
    the prompt, counted."""
    anchor = None
    await count_rereads(forwarded)
    usage = await usage_of(reply) if reply is not None else None
    cache = prompt_cache_use(usage) if usage is not None else None
    if cache is not None:
        for kind, tokens in zip(PROMPT_CACHE_KINDS, cache, strict=True):
            if tokens:
                child(UPSTREAM_PROMPT_TOKENS, route, kind).inc(tokens)
    if reply is not None and usage is not None:
        read, written = (cache.read, cache.written) if cache is not None else (0, 0)
        event = usage_event(
            now=time.time(),
            usage=usage,
            status=reply.status,
            cache_read=read,
            cache_written=written,
        )
        log_entry.add(event)
        log_entry.set(answer_attributes(forwarded.state, usage))
        prompt_tokens = usage.get("prompt_tokens")
        measurement = forwarded.measurement
        if measurement is not None and isinstance(prompt_tokens, int) and prompt_tokens > 0:
            anchor = measurement.anchor_for(prompt_tokens)
            if not measurement.anchored:
                METER_ERROR.observe((measurement.tokens - prompt_tokens) / prompt_tokens)
                view = log_entry.log.view
                services.engine.meter.calibrate(
                    view.tenant, view.model, measurement.estimated, prompt_tokens
                )
    # A lost log entry is counted by the instrumented store; not worth failing a request.
    try:
        await write_request_log(services.store, services.settings, log_entry, anchor)
    except StoreUnavailable:
        pass
    except Exception:
        log.exception("recording the request failed")
