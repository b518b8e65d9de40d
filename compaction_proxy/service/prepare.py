"""Before forwarding: read the conversation, relieve pressure, derive the surface to send.

Raises StoreUnavailable when the store cannot be reached; the handler then forwards the
client's request unchanged. Any other failure inside compaction is logged and counted, and the
request goes on with the best surface there is: the proxy never makes a request worse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.guards.miss_guard import (
    checkpoint_misses,
    proactive_compaction_stopped,
)
from compaction_proxy.compaction.masking import live_rereads
from compaction_proxy.compaction.model_policy import Budgets, ModelPolicy
from compaction_proxy.compaction.outcomes import Relief
from compaction_proxy.compaction.planning import CompactionJob, SummaryCall, SummaryRequest
from compaction_proxy.compaction.pressure import maybe_precompact, pressure_limits, report_shortfall
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.compaction.summarize import (
    Summary,
    SummaryFailed,
    call_summarizer,
)
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import Route
from compaction_proxy.conversation.client_compaction import (
    is_client_compaction,
    is_continued_history,
)
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire import SummaryPost, WireFormat
from compaction_proxy.formats.wire_formats import CHAT
from compaction_proxy.metering.meter import TokenMeter
from compaction_proxy.metrics import (
    CLIENT_COMPACTIONS,
    COMPACTION_ERRORS,
    MASKED_REREADS,
    PRESSURE,
    TOKENS_SAVED,
    child,
)
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.security.credentials import (
    summary_call_fields,
    summary_call_headers,
    summary_call_query,
)
from compaction_proxy.security.outbound import upstream_headers, upstream_url
from compaction_proxy.security.tenant import api_key_of, tenant_of
from compaction_proxy.service.forwarded import Forwarded, RequestStatus, status_of
from compaction_proxy.service.pending_writes import shielded
from compaction_proxy.service.request_log import RequestLogEntry
from compaction_proxy.service.services import Services
from compaction_proxy.store.attributes import ConversationAttributes, ShortfallReason
from compaction_proxy.store.base import ConversationState, StoreUnavailable

log = logging.getLogger(__name__)


def summary_call(
    services: Services,
    client_headers: Mapping[str, str],
    client_query: str,
    request_route: Route,
    summary_model: str,
    route: Route,
    wire: WireFormat,
    tenant: str,
    client_request: ClientRequest | None = None,
) -> SummaryCall:
    """The summary call: the summary model's route, the configured timeout, and of the
    client's headers only those ``summary_call_headers`` allows (its credentials only when
    the summary goes to the host its request went to; the route's own key otherwise), with
    the client's query string on the same terms. Made first cache-safe, in the client's own
    format (``WireFormat.cache_safe_summary``), when the summary model is the request's and
    the span goes as forwarded; else (or when that gives no summary) rebuilt from the chat
    form as the format's route takes it (``WireFormat.rebuilt_summary``). Either names the end
    user the client's request names (``WireFormat.end_user_fields``) when it goes to the same
    upstream. ``route``: the summary model's."""
    timeout = services.settings.summary_timeout_seconds
    anthropic = wire.family is ApiFamily.ANTHROPIC

    async def post(
        headers: MutableMapping[str, str], call: SummaryPost, end_user: dict[str, Any]
    ) -> Summary:
        query = summary_call_query(client_query, request_route, route)
        url = upstream_url(route.base, call.path, query)
        for name, value in call.headers.items():
            headers.setdefault(name, value)
        body = {**call.body, **end_user} if end_user else call.body
        try:
            return await call_summarizer(services.upstream, url, headers, body, timeout, call.read)
        except SummaryFailed as failure:
            sent = api_key_of(headers)
            failure.caller_credential = bool(sent) and sent == api_key_of(client_headers)
            if failure.reason == "overflow" and failure.limit is not None:
                # The summary model stated its window: later summary calls are sized to it.
                services.learned_windows.learn(route.model, tenant, summary_model, failure.limit)
            raise

    async def call(request: SummaryRequest) -> Summary:
        # Made here, not per request: most requests never call the summarizer.
        allowed = summary_call_headers(client_headers, request_route, route)
        keys = services.client_keys.required
        headers = upstream_headers(allowed, route.api_key_env, proxy_keys=keys, anthropic=anthropic)
        headers["Content-Type"] = "application/json"
        end_user = (
            summary_call_fields(client_request.body, wire.end_user_fields, request_route, route)
            if client_request is not None
            else {}
        )
        cache_safe = None
        chosen = request.read_through or request
        if (
            client_request is not None
            and chosen.prefix is not None
            and client_request.model == summary_model
        ):
            cache_safe = wire.cache_safe_summary(client_request, chosen.prefix, chosen.body)
        if cache_safe is not None:
            try:
                return await post(headers, cache_safe, end_user)
            except SummaryFailed as failure:
                if failure.reason not in cache_safe.rebuilt_after:
                    raise
                log.info("cache-safe summary call: %s; made again rebuilt", failure.reason)
        return await post(headers, wire.rebuilt_summary(request.body), end_user)

    return call


def _count_savings(route: str, surface: Surface, saved: int) -> None:
    """Split a request's saved tokens between its checkpoints, then its masks and prunes (by
    the characters each cleared: their tokens are not priced apart)."""
    if saved <= 0:
        return
    by_summary = sum(max(0, c.shadowed_tokens - c.tokens) for c in surface.checkpoints)
    by_summary = min(by_summary, saved)
    if by_summary:
        TOKENS_SAVED.labels(route=route, mechanism="summary").inc(by_summary)
    rest = saved - by_summary
    if rest <= 0:
        return
    cleared = [max(0, p.chars_before - p.chars_after) for p in surface.prunes]
    masked = sum(c for c, p in zip(cleared, surface.prunes, strict=True) if p.masked)
    by_mask = rest * masked // sum(cleared) if masked else 0
    if by_mask:
        TOKENS_SAVED.labels(route=route, mechanism="mask").inc(by_mask)
    if rest > by_mask:
        TOKENS_SAVED.labels(route=route, mechanism="prune").inc(rest - by_mask)


async def count_rereads(forwarded: Forwarded) -> None:
    """Count the live turn's calls that repeat one whose output a mask cleared (after the
    answer: the count changes nothing the client waits for)."""
    job, surface = forwarded.job, forwarded.surface
    if job is None or surface is None or not surface.masks:
        return
    masked = {record.position for record in surface.masks}
    view = job.view
    again = await off_loop_if(
        view.big,
        lambda: live_rereads(
            view.body, view.live_start, masked.__contains__, job.pruner.user_messages
        ),
    )
    if again:
        MASKED_REREADS.labels(route=job.route).inc(again)


async def _relieve(
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    limits: Budgets | None,
    proactive: bool,
) -> Relief:
    # The surface as the loaded state has it: forwarded when nothing is to be done, or when
    # compaction fails (the checkpoints already loaded still stand).
    surface = job.view.surface(state.records)
    as_it_is = Relief(state, surface, await engine.measure(job, state, surface))
    if limits is None:
        return as_it_is
    if not proactive:
        return dataclasses.replace(as_it_is, shortfall=ShortfallReason.STOPPED)
    if as_it_is.measurement.tokens < limits.threshold:
        return as_it_is  # most requests: nothing to compact, so no task to shield it in
    try:
        return await shielded(triggers.relieve_pressure(engine, job, state, limits))
    except StoreUnavailable as exc:
        log.warning("store unavailable during compaction (%s)", exc.operation)
        return dataclasses.replace(as_it_is, shortfall=ShortfallReason.STORE)
    except Exception:
        COMPACTION_ERRORS.inc()
        log.exception("compaction failed; forwarding the surface as it was")
        return dataclasses.replace(as_it_is, shortfall=ShortfallReason.ERROR)


def _replaced_history(view: RequestView, state: ConversationState) -> bool:
    """Whether the request is the first of a history the client rebuilt from its own summary:
    it opens with the agent's continuation words and does not extend what was answered."""
    anchor = state.anchor
    answered = anchor is not None and anchor.answered(view.chain)
    return not answered and is_continued_history(view.body)


async def view_of(
    meter: TokenMeter, tenant: str, client_request: ClientRequest, session_id: str | None
) -> RequestView:
    """The request's view; for a big request, built and metered once off the loop, so every
    later measurement of it is cache hits."""

    def build() -> RequestView:
        tools = client_request.body.get("tools")
        return RequestView.of(
            tenant,
            client_request.model,
            client_request.messages,
            session_id,
            tools,
            size=len(client_request.raw),
            digests=client_request.digests,
            lineage=client_request.lineage,
        )

    if not is_big(len(client_request.raw), len(client_request.messages)):
        return build()

    def build_and_meter() -> RequestView:
        view = build()
        view.measure(meter, view.surface(()))
        return view

    return await asyncio.to_thread(build_and_meter)


def compaction_job(
    services: Services,
    view: RequestView,
    model_policy: ModelPolicy,
    window: int | None,
    client_headers: Mapping[str, str],
    client_query: str = "",
    wire: WireFormat = CHAT,
    client_request: ClientRequest | None = None,
) -> CompactionJob:
    """The compaction inputs for ``view``: its policy and window, and the summary route with
    its own window when the summary model is another model (``wire``: the request's format,
    and its summary calls'; ``client_request``, when at hand, lets them start as its own next
    request would)."""
    summary_model = model_policy.policy.summary_model or view.model
    summary_policy, summary_window = model_policy, None
    if summary_model != view.model:
        summary_policy = services.policies.for_model(summary_model, wire.family)
        summary_window = services.model_window(summary_policy, summary_model, view.tenant)
    return CompactionJob(
        view=view,
        policy=model_policy.policy,
        pruner=model_policy.pruner,
        window=window,
        summary_model=summary_model,
        summarize=summary_call(
            services,
            client_headers,
            client_query,
            model_policy.route,
            summary_model,
            summary_policy.route,
            wire,
            view.tenant,
            client_request,
        ),
        route=model_policy.route.model,
        summary_window=summary_window,
        summary_route=summary_policy.route.model,
        bridge=model_policy.bridge,
        masker=model_policy.masker,
        prices=model_policy.prices,
        # Only a call made in the client's own format, as its next request would be
        # (``summary_call``), reads the client's cache: no other plans to read through.
        reads_through=wire.caches_at_breakpoints
        and client_request is not None
        and client_request.model == summary_model,
    )


async def prepare(
    services: Services,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
    client_headers: Mapping[str, str],
    client_query: str,
) -> tuple[Forwarded, RequestLogEntry]:
    """What to forward for ``client_request``, and its log entry, begun."""
    settings, engine = services.settings, services.engine
    route = model_policy.route
    tenant = tenant_of(await services.tenant_secret.get(), api_key_of(client_headers))
    view = await view_of(engine.meter, tenant, client_request, session_id)
    # The previous request's writes (its anchor, its miss count, its log) come first.
    await services.pending_log_writes.settled(view.conversation)
    state = await services.store.load(view.conversation, view.chain)
    now = time.time()
    log_entry = RequestLogEntry.start(
        view, state, client_request.model, tenant, session_id, now, client_request.api
    )
    window = services.model_window(
        model_policy, client_request.model, tenant, client_request.declared_window
    )
    if window is None:
        services.learned_windows.warn_unknown_once(route.model, client_request.model)
    job = compaction_job(
        services,
        view,
        model_policy,
        window,
        client_headers,
        client_query,
        client_request.wire,
        client_request,
    )
    misses = checkpoint_misses(view, state, settings.checkpoint_miss_limit)
    proactive = not proactive_compaction_stopped(misses, settings.checkpoint_miss_limit)
    client_compacting = is_client_compaction(view.body, view.tools)
    seen = state.attributes.client_compactions or 0
    if client_compacting:
        CLIENT_COMPACTIONS.labels(route=route.model).inc()
        # The branch being summarized is about to be replaced: a round for it is wasted.
        services.background.abandon(view.conversation, view.chain)
        log_entry.set(ConversationAttributes(client_compactions=seen + 1))
    elif _replaced_history(view, state):
        # The first request of a history the client rebuilt from its own summary (its
        # summarization request, if any, went unrecognized when ``seen`` is 0).
        services.background.abandon(view.conversation, view.chain, replaced=True)
        if not seen:
            CLIENT_COMPACTIONS.labels(route=route.model).inc()
            log_entry.set(ConversationAttributes(client_compactions=1))
    limits = pressure_limits(model_policy, window, client_request, state, client_compacting)
    relief = await _relieve(engine, job, state, limits, proactive)
    if window is not None and model_policy.policy.rescue_live_turn:
        relief = await triggers.rescue(engine, job, relief, window, client_request.answer_cap)
    state, surface, measurement = relief.state, relief.surface, relief.measurement
    pressure = reason = None
    if window is not None:
        pressure = measurement.tokens / window
        child(PRESSURE, route.model).observe(pressure)
        if limits is not None:
            reason = report_shortfall(view, state, route.model, relief, limits.threshold)
    log_entry.set(
        ConversationAttributes(
            checkpoint_misses=misses, last_pressure=pressure, over_threshold=reason
        )
    )
    status = status_of(surface)
    if relief.rescued or relief.dropped_turns:
        status = RequestStatus.RESCUED if relief.rescued else RequestStatus.TRIMMED
    started = None
    if proactive:
        started = await maybe_precompact(engine, services.background, job, relief, limits)
    job = started or job

    tokens_before = None
    payload = client_request.raw
    if surface.changed:
        payload = await off_loop_if(
            view.big, lambda: client_request.wire.payload(client_request, surface)
        )
        unchanged = view.measure(engine.meter, view.surface(()))
        tokens_before = unchanged.tokens
        _count_savings(route.model, surface, unchanged.estimated - measurement.estimated)
    forwarded = Forwarded(
        payload=payload,
        status=status,
        conversation=view.conversation,
        generation=state.generation,
        measurement=measurement,
        tokens_before=tokens_before,
        job=job,
        state=state,
        surface=surface,
        precompacting=started is not None,
    )
    log_entry.add_forwarded(forwarded, client_request.model, route.model, time.time())
    return forwarded, log_entry
