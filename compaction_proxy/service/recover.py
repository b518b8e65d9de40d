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

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.guards.miss_guard import (
    proactive_compaction_stopped,
    recovery_cooling_down,
)
from compaction_proxy.compaction.model_policy import ModelPolicy, budgets
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.conversation.messages import Message
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.metrics import COMPACTION_ERRORS
from compaction_proxy.service.forwarded import Forwarded, RequestStatus
from compaction_proxy.service.pending_writes import shielded
from compaction_proxy.service.request_log import RequestLogEntry
from compaction_proxy.service.services import Services
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import ConversationState, StoreUnavailable

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
    engine: Engine,
    job: CompactionJob,
    state: ConversationState,
    threshold: int | None,
    window_is_a_guess: bool,
) -> None:
    try:
        await shielded(triggers.recover_overflow(engine, job, state, threshold, window_is_a_guess))
    except StoreUnavailable:
        raise
    except Exception:
        COMPACTION_ERRORS.inc()
        log.exception("overflow compaction failed")


async def retry_after_overflow(
    services: Services,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    forwarded: Forwarded,
    log_entry: RequestLogEntry,
) -> Forwarded | None:
    """Compact after an overflow; the attempt to retry with, or None to pass the error on.
    The retry's ``request`` event is the caller's to add, after the overflow's."""
    job, state, failed = forwarded.job, forwarded.state, forwarded.surface
    if job is None or state is None or failed is None:
        return None
    settings, engine = services.settings, services.engine
    window = services.model_window(
        model_policy, client_request.model, job.view.tenant, client_request.declared_window
    )
    window_is_a_guess = window is None and forwarded.measurement is not None
    if window is None and forwarded.measurement is not None:
        # The upstream stated no limit and none is known, but the request that overflowed is
        # an upper bound: summary calls must fit below it.
        window = max(1, forwarded.measurement.tokens - 1)
    job = dataclasses.replace(job, window=window)
    threshold = budgets(model_policy.policy, window).threshold if window is not None else None
    if window is not None and engine.planner.irreducible_tokens(job, failed) > window:
        # The live turn alone (with head and tools) does not fit: compacting the past cannot
        # help, so the upstream's own answer stands.
        return None
    if proactive_compaction_stopped(log_entry.attributes.misses, settings.checkpoint_miss_limit):
        now = time.time()
        last = state.attributes.overflow_recovery_at
        cooldown = settings.failure_cooldown_seconds
        if recovery_cooling_down(last, now, cooldown, job.view.conversation):
            return None
        # Written with the request's other attributes, whether this recovery commits or not.
        log_entry.set(ConversationAttributes(overflow_recovery_at=now))
    try:
        await _compact(engine, job, state, threshold, window_is_a_guess)
        fresh = await services.store.load(job.view.conversation, job.view.chain)
    except StoreUnavailable:
        return None
    surface = job.view.surface(fresh.records)
    if not should_retry(state.generation, failed.messages, fresh.generation, surface.messages):
        return None
    return Forwarded(
        payload=client_request.wire.payload(client_request, surface),
        status=RequestStatus.RECOVERED,
        conversation=job.view.conversation,
        generation=fresh.generation,
        measurement=job.view.measure(engine.meter, surface, fresh.anchor),
        tokens_before=job.view.measure(engine.meter, job.view.surface(())).tokens,
        job=job,
        state=fresh,
        surface=surface,
    )
