"""Before forwarding: log the request, relieve pressure, derive the surface to send.

Raises StoreUnavailable when the store cannot be reached; the handler then forwards the
client's request unchanged. Any other failure inside compaction is logged and counted, and the
request goes on with the best surface there is: the proxy never makes a request worse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.ahead import maybe_precompact, pressure_limits
from proxy.client_request import ClientRequest
from proxy.compaction import triggers
from proxy.compaction.engine import Engine, Relief
from proxy.compaction.planning import CompactionJob, SummaryCall
from proxy.compaction.summarize import Summary, SummaryFailed, call_summarizer
from proxy.config import Route
from proxy.credentials import summary_call_headers, summary_call_query
from proxy.events import request_event
from proxy.guards import trip
from proxy.keys import (
    BACKGROUND,
    CLIENT_KEYS,
    ENGINE,
    HTTP_CLIENT,
    LEARNED_WINDOWS,
    PENDING_RECORDS,
    POLICIES,
    SETTINGS,
    STORE,
    TENANT_SECRET,
)
from proxy.meter import Measurement, TokenMeter
from proxy.metrics import (
    CHECKPOINT_MISSES,
    COMPACTION_ERRORS,
    PRESSURE,
    PROACTIVE_STOPPED,
    TOKENS_SAVED,
    child,
)
from proxy.offload import is_big, off_loop_if
from proxy.payload import payload_for
from proxy.policy import Budgets, ModelPolicy
from proxy.request_log import PendingLog, pending_log
from proxy.request_view import RequestView
from proxy.shortfall import OVER_THRESHOLD_REASON, report_shortfall
from proxy.store.base import ConversationState, Event, StoreUnavailable
from proxy.surface import Surface, missed_checkpoints
from proxy.tasks import shielded
from proxy.tenant import api_key_of, tenant_of
from proxy.upstream import client_query, upstream_headers, upstream_url
from proxy.windows import resolve_window

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """What to forward, and what to remember about it afterwards."""

    payload: bytes
    status: str
    conversation: str | None = None
    generation: int | None = None
    measurement: Measurement | None = None
    tokens_before: int | None = None
    job: CompactionJob | None = None
    state: ConversationState | None = None
    surface: Surface | None = None  # what the payload carries
    # Logged after the answer, with its usage, in the request's second round trip.
    pending_events: list[Event] = field(default_factory=list)
    pending_attributes: dict[str, str] = field(default_factory=dict)
    log: PendingLog | None = None  # what else it logs then (None: the request is not logged)


def summary_call(
    app: web.Application,
    client_headers: Mapping[str, str],
    client_query: str,
    request_route: Route,
    summary_model: str,
) -> SummaryCall:
    """The summary call: the summary model's route, the configured timeout, and of the
    client's headers only those ``summary_call_headers`` allows (its credentials only when
    the summary goes to the host its request went to; the route's own key otherwise), with
    the client's query string on the same terms."""
    route = app[POLICIES].for_model(summary_model).route
    timeout = app[SETTINGS].summary_timeout_seconds

    async def call(body: dict[str, Any]) -> Summary:
        # Made here, not per request: most requests never call the summarizer.
        allowed = summary_call_headers(client_headers, request_route, route)
        keys = app[CLIENT_KEYS].required
        headers = upstream_headers(allowed, route.api_key_env, proxy_keys=keys)
        headers["Content-Type"] = "application/json"
        query = summary_call_query(client_query, request_route, route)
        url = upstream_url(route.base, "/chat/completions", query)
        try:
            return await call_summarizer(app[HTTP_CLIENT], url, headers, body, timeout)
        except SummaryFailed as failure:
            if failure.reason == "overflow" and failure.limit is not None:
                # The summary model stated its window: later summary calls are sized to it.
                app[LEARNED_WINDOWS].learn(route.model, summary_model, failure.limit)
            raise

    return call


def _count_savings(route: str, surface: Surface, saved: int) -> None:
    """Split a request's saved tokens between its checkpoints and its prunes."""
    if saved <= 0:
        return
    by_summary = sum(max(0, c.shadowed_tokens - c.tokens) for c in surface.checkpoints)
    by_summary = min(by_summary, saved)
    if by_summary:
        TOKENS_SAVED.labels(route=route, mechanism="summary").inc(by_summary)
    if saved > by_summary:
        TOKENS_SAVED.labels(route=route, mechanism="prune").inc(saved - by_summary)


MISSES = "checkpoint_misses"


def proactive_compaction_stopped(misses: int, miss_limit: int) -> bool:
    """Whether a conversation missed its checkpoints too often in a row to be compacted
    proactively any more (``miss_limit`` 0: never stops; pure)."""
    return miss_limit > 0 and misses >= miss_limit


def _checkpoint_misses(view: RequestView, state: ConversationState, limit: int) -> int:
    """Requests in a row that missed every committed checkpoint, this one included."""
    misses = int(state.attributes.get(MISSES, "0"))
    surface = view.surface(state.records)
    if missed_checkpoints(view.applicable(state.records), surface, view.body_digests):
        misses += 1
        CHECKPOINT_MISSES.inc()
        if misses == limit:
            PROACTIVE_STOPPED.inc()
            trip(
                "miss_guard",
                view.conversation,
                "the conversation keeps missing its own checkpoints (the client rewrites early "
                "messages?): proactive compaction stops for it",
            )
    elif surface.checkpoints:
        misses = 0
    return misses


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
        return dataclasses.replace(as_it_is, shortfall="stopped")
    if as_it_is.measurement.tokens < limits.threshold:
        return as_it_is  # most requests: nothing to compact, so no task to shield it in
    try:
        return await shielded(triggers.relieve_pressure(engine, job, state, limits))
    except StoreUnavailable as exc:
        log.warning("store unavailable during compaction (%s)", exc.operation)
        return dataclasses.replace(as_it_is, shortfall="store")
    except Exception:
        COMPACTION_ERRORS.inc()
        log.exception("compaction failed; forwarding the surface as it was")
        return dataclasses.replace(as_it_is, shortfall="error")


async def _view_of(
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


def model_window(app: web.Application, model_policy: ModelPolicy, model: str) -> int | None:
    """The window in force for ``model``: configured, else litellm's map, never above a limit
    the upstream stated."""
    learned = app[LEARNED_WINDOWS].get(model_policy.route.model, model)
    return resolve_window(model_policy.configured_window, model_policy.mapped_window, learned)


def compaction_job(
    app: web.Application,
    view: RequestView,
    model_policy: ModelPolicy,
    window: int | None,
    client_headers: Mapping[str, str],
    client_query: str = "",
) -> CompactionJob:
    """The compaction inputs for ``view``: its policy and window, and the summary route with
    its own window when the summary model is another model."""
    summary_model = model_policy.policy.summary_model or view.model
    summary_policy = app[POLICIES].for_model(summary_model)
    summary_window = None
    if summary_model != view.model:
        summary_window = model_window(app, summary_policy, summary_model)
    return CompactionJob(
        view=view,
        policy=model_policy.policy,
        pruner=model_policy.pruner,
        window=window,
        summary_model=summary_model,
        summarize=summary_call(
            app, client_headers, client_query, model_policy.route, summary_model
        ),
        route=model_policy.route.model,
        summary_window=summary_window,
        summary_route=summary_policy.route.model,
        bridge=model_policy.bridge,
    )


async def prepare(
    request: web.Request,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
) -> Prepared:
    app = request.app
    settings, engine = app[SETTINGS], app[ENGINE]
    route = model_policy.route
    tenant = tenant_of(await app[TENANT_SECRET].get(), api_key_of(request.headers))
    view = await _view_of(engine.meter, tenant, client_request, session_id)
    # The previous request's writes (its anchor, its miss count, its log) come first.
    await app[PENDING_RECORDS].settled(view.conversation)
    state = await app[STORE].load(view.conversation)
    log = pending_log(view, state, client_request.model, tenant, session_id, time.time())
    window = model_window(app, model_policy, client_request.model)
    if window is None:
        app[LEARNED_WINDOWS].warn_unknown_once(route.model, client_request.model)
    job = compaction_job(app, view, model_policy, window, request.headers, client_query(request))
    misses = _checkpoint_misses(view, state, settings.checkpoint_miss_limit)
    proactive = not proactive_compaction_stopped(misses, settings.checkpoint_miss_limit)
    limits = pressure_limits(model_policy, window, client_request, state)
    relief = await _relieve(engine, job, state, limits, proactive)
    state, surface, measurement = relief.state, relief.surface, relief.measurement
    if window is not None:
        child(PRESSURE, route.model).observe(measurement.tokens / window)
    status = "compacted" if relief.compacted else "pruned" if relief.pruned else "none"

    forwarded = request_event(
        now=time.time(),
        model=client_request.model,
        route=route.model,
        generation=state.generation,
        body_length=len(view.body),
        surface_length=len(surface.nodes),
        estimated_tokens=measurement.tokens,
        anchored=measurement.anchored,
        status=status,
        tip=view.chain[-1] if view.chain else None,
        context=view.context_digest,
        digests=view.body_digests if log.by_content else None,
    )
    attributes = {MISSES: str(misses)}
    if window is not None:
        attributes["last_pressure"] = f"{measurement.tokens / window:.4f}"
        if limits is not None:
            attributes[OVER_THRESHOLD_REASON] = report_shortfall(
                view, state, route.model, relief, limits.threshold
            )

    started = proactive and maybe_precompact(app[BACKGROUND], job, relief, limits)
    if started and status == "none":
        status = "precompacting"

    tokens_before = None
    payload = client_request.raw
    if surface.changed:
        payload = await off_loop_if(view.big, lambda: payload_for(client_request, surface))
        unchanged = view.measure(engine.meter, view.surface(()))
        tokens_before = unchanged.tokens
        forwarded["client_tokens"] = tokens_before
        _count_savings(route.model, surface, unchanged.estimated - measurement.estimated)
    return Prepared(
        payload=payload,
        status=status,
        conversation=view.conversation,
        generation=state.generation,
        measurement=measurement,
        tokens_before=tokens_before,
        job=job,
        state=state,
        surface=surface,
        pending_events=[forwarded],
        pending_attributes=attributes,
        log=log,
    )
