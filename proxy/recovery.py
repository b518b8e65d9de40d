"""Overflow recovery: compact after the upstream said the context overflowed, and retry only on
evidence.

Retries need evidence: after compacting, the conversation is read back from the store, and the
request is retried only if the generation advanced past the one its failed surface was derived
at **and** the surface re-derived for this very request differs from the one that failed. What
the compaction code reports is not trusted for this decision, so a compaction backend that
claims success without committing anything can never cause a retry.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from aiohttp import web

from proxy.client_request import ClientRequest
from proxy.compaction import triggers
from proxy.compaction.engine import Engine
from proxy.config import Settings
from proxy.conversation import Message
from proxy.events import request_event
from proxy.guards import trip
from proxy.keys import ENGINE, SETTINGS, STORE
from proxy.metrics import COMPACTION_ERRORS
from proxy.payload import payload_for
from proxy.policy import ModelPolicy, budgets
from proxy.preparation import MISSES, Prepared, model_window
from proxy.store.base import ConversationState, StoreUnavailable
from proxy.tasks import shielded

log = logging.getLogger(__name__)


def should_retry(
    snapshot_generation: int,
    failed: list[Message],
    fresh_generation: int,
    fresh: list[Message],
) -> bool:
    """A retry is allowed only after a commit since the snapshot that changed this surface."""
    return fresh_generation > snapshot_generation and fresh != failed


async def _compact(
    engine: Engine, prepared: Prepared, threshold: int | None, window_is_a_guess: bool
) -> None:
    assert prepared.job is not None and prepared.state is not None
    try:
        await shielded(
            triggers.recover_overflow(
                engine, prepared.job, prepared.state, threshold, window_is_a_guess
            )
        )
    except StoreUnavailable:
        raise
    except Exception:
        COMPACTION_ERRORS.inc()
        log.exception("overflow compaction failed")


RECOVERED_AT = "overflow_recovery_at"


def _recovery_cooling_down(
    settings: Settings, prepared: Prepared, state: ConversationState
) -> bool:
    """The miss guard covers overflow recovery too: a conversation that stopped matching its
    own checkpoints (its client rewrites early messages) gets at most one recovery summary per
    ``failure_cooldown_seconds``, instead of one or more on every request that overflows."""
    limit = settings.checkpoint_miss_limit
    misses = int(prepared.pending_attributes.get(MISSES, "0"))
    if limit == 0 or misses < limit:
        return False
    now = time.time()
    last = float(state.attributes.get(RECOVERED_AT, "0"))
    if now - last < settings.failure_cooldown_seconds:
        trip("recovery_cooldown", prepared.conversation or "", "overflow recovery waits")
        return True
    # Written with the request's other attributes, whether this recovery commits or not.
    prepared.pending_attributes[RECOVERED_AT] = f"{now:.3f}"
    return False


async def recover_overflow(
    request: web.Request,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    prepared: Prepared,
) -> Prepared | None:
    """Compact after an overflow; the request to retry with, or None to pass the error on."""
    job, state = prepared.job, prepared.state
    if job is None or state is None or prepared.surface is None:
        return None
    app = request.app
    route = model_policy.route
    window = model_window(app, model_policy, client_request.model)
    window_is_a_guess = window is None and prepared.measurement is not None
    if window is None and prepared.measurement is not None:
        # The upstream stated no limit and none is known, but the request that overflowed is
        # an upper bound: summary calls must fit below it.
        window = max(1, prepared.measurement.tokens - 1)
    job = dataclasses.replace(job, window=window)
    threshold = budgets(model_policy.policy, window).threshold if window is not None else None
    engine = app[ENGINE]
    failed = job.view.surface(state.records)
    if window is not None and engine.planner.irreducible_tokens(job, failed) > window:
        # The live turn alone (with head and tools) does not fit: compacting the past cannot
        # help, so the upstream's own answer stands.
        return None
    if _recovery_cooling_down(app[SETTINGS], prepared, state):
        return None
    try:
        await _compact(engine, dataclasses.replace(prepared, job=job), threshold, window_is_a_guess)
        fresh = await app[STORE].load(job.view.conversation)
    except StoreUnavailable:
        return None
    surface = job.view.surface(fresh.records)
    sent = prepared.surface.messages
    if not should_retry(state.generation, sent, fresh.generation, surface.messages):
        return None
    measurement = job.view.measure(engine.meter, surface, fresh.anchor)
    tokens_before = job.view.measure(engine.meter, job.view.surface(())).tokens
    event = request_event(
        now=time.time(),
        model=client_request.model,
        route=route.model,
        generation=fresh.generation,
        body_length=len(job.view.body),
        surface_length=len(surface.nodes),
        estimated_tokens=measurement.tokens,
        anchored=measurement.anchored,
        status="recovered",
        tip=job.view.chain[-1] if job.view.chain else None,
        context=job.view.context_digest,
        client_tokens=tokens_before,
    )
    return Prepared(
        payload=payload_for(client_request, surface),
        status="recovered",
        conversation=job.view.conversation,
        generation=fresh.generation,
        measurement=measurement,
        tokens_before=tokens_before,
        job=job,
        state=fresh,
        surface=surface,
        pending_events=[*prepared.pending_events, event],
        pending_attributes=prepared.pending_attributes,
        log=prepared.log,
    )
