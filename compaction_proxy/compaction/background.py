"""Checkpoints prepared ahead of need, so that no request waits for a summary call.

When a request's pressure crosses ``precompact`` (below the threshold), it is forwarded at once
and one summary round starts in the background: select, summarize, commit, under the usual
lease, ceilings and breaker. The request that later reaches the threshold finds the checkpoint
committed. If the round is still running (the conversation outgrew the summary call), or none
could start before (one turn jumped both watermarks), a request under ``must_compact`` (the
window less the room its answer needs, ``model_policy.answer_reserve``) is still forwarded at once,
as it is, and the round runs or starts in the background. From ``must_compact`` a request of a
conversation already answered goes at once with the bridge's cuts (``bridge.py``); only one the
bridge cannot fit, or a history on first contact, waits on the lease or compacts
synchronously, as without precompaction.

**Which span.** The conversation keeps growing while the summary is written, and the checkpoint
applies as soon as it is committed. It is selected with a retain budget smaller than the usual
one by the growth still expected before the threshold (``threshold - tokens now``). Committed at
``precompact``, the surface then drops to that smaller tail; it regrows to the threshold
over the same distance as after a synchronous compaction (``precompact - retain'`` equals
``threshold - retain``), so a conversation pays for as many summaries either way, and its
provider prefix cache misses once per checkpoint either way, only earlier.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.model_policy import Budgets, precompaction_retain
from compaction_proxy.compaction.outcomes import Outcome
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.metrics import PRECOMPACTION_DURATION, PRECOMPACTIONS_IN_FLIGHT
from compaction_proxy.store.base import ConversationState, StoreUnavailable

log = logging.getLogger(__name__)

TRIGGER = "precompact"


def may_take_a_slot(held: int, running: int, concurrency: int) -> bool:
    """Whether a tenant holding ``held`` of the ``running`` rounds may start one more: while
    it holds less than its share (a quarter of the slots, at least one), whenever a slot is
    free; beyond it, only while more than a share would stay free for other tenants. One
    tenant running many agents at once then never takes every slot: another's conversation
    still gets its checkpoint prepared ahead, instead of waiting for a summary call at its
    threshold. Alone, a tenant can hold all but one share."""
    free = concurrency - running
    share = max(1, concurrency // 4)
    return free > 0 and (held < share or free > share)


class BackgroundCompactions:
    """At most ``concurrency`` rounds at once in this process, one per conversation, and a
    tenant's within ``may_take_a_slot``; a request that finds no slot it may take is
    forwarded all the same (the threshold request then compacts synchronously, as without
    precompaction)."""

    def __init__(self, engine: Engine, concurrency: int) -> None:
        self._engine = engine
        self._concurrency = concurrency
        self._running: dict[str, asyncio.Task[None]] = {}
        self._chains: dict[str, list[str]] = {}  # the body chain each round was started from
        self._held: Counter[str] = Counter()  # rounds running per tenant

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def could_start(self, job: CompactionJob, state: ConversationState) -> bool:
        """Whether a round for ``job`` would find a slot and a free lease (cheap: asked before
        the costlier checks that precede ``start``)."""
        conversation, tenant = job.view.conversation, job.view.tenant
        if conversation in self._running:
            return False
        if not may_take_a_slot(self._held[tenant], len(self._running), self._concurrency):
            return False
        return state.lease_owner is None

    def start(
        self, job: CompactionJob, state: ConversationState, tokens: int, limits: Budgets
    ) -> bool:
        if not self.could_start(job, state):
            return False
        if triggers.cooling_down(self._engine, state, tokens):
            return False
        conversation, tenant = job.view.conversation, job.view.tenant
        retain = precompaction_retain(tokens, limits)
        task = asyncio.create_task(self._round(job, state, tokens, retain))
        self._running[conversation] = task
        self._chains[conversation] = job.view.chain
        self._held[tenant] += 1
        PRECOMPACTIONS_IN_FLIGHT.inc()

        def finished(_: asyncio.Task[None]) -> None:
            self._running.pop(conversation, None)
            self._chains.pop(conversation, None)
            self._held[tenant] -= 1
            if not self._held[tenant]:
                del self._held[tenant]
            PRECOMPACTIONS_IN_FLIGHT.dec()

        task.add_done_callback(finished)
        return True

    async def _round(
        self, job: CompactionJob, state: ConversationState, tokens: int, retain: int
    ) -> None:
        engine = self._engine
        started, outcome = time.perf_counter(), Outcome.ERROR.value
        try:
            surface = job.view.surface(state.records)
            result = await engine.summarize_round(job, state, surface, retain, TRIGGER)
            outcome = result.outcome.value
            await triggers.remember_failure(engine, job, tokens, result)
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED.value
            # Shutting down, or the client abandoned the branch: the engine closed the
            # attempt and released the lease.
            raise
        except StoreUnavailable as exc:
            # The store went away mid-round: said as everywhere else, without a traceback.
            log.warning("store unavailable during a background round (%s)", exc.operation)
        except Exception:
            log.exception("background compaction failed; the threshold request will compact")
        finally:
            PRECOMPACTION_DURATION.labels(outcome=outcome).observe(time.perf_counter() - started)

    def abandon(self, conversation: str, chain: Sequence[str], *, replaced: bool = False) -> bool:
        """Cancel the round in flight for the branch ``chain`` extends: the client is about to
        replace that history with a summary of its own, and the checkpoint would never be
        used. With ``replaced``, ``chain`` is the history that replaced it: the round is
        cancelled when ``chain`` does not extend its branch. Whether one was cancelled; the
        engine closes its attempt and frees the lease."""
        task, started = self._running.get(conversation), self._chains.get(conversation)
        if task is None or not started:
            return False
        tip = len(started) - 1
        extends = len(chain) > tip and chain[tip] == started[tip]
        if extends == replaced:
            return False  # another branch's round (a twin's), or the one still in use
        task.cancel()
        return True

    async def idle(self) -> None:
        """Wait until no round is running (``eval``, tests and benchmarks settle on it).

        ``asyncio.wait``, not ``gather``: a round whose task is done is still held until its
        done callback runs, on a later turn of the loop. ``wait`` always gives the loop that
        turn; ``gather`` of tasks already done returns without yielding from Python 3.12, so
        a loop over it never let the callback run and spun forever."""
        while self._running:
            await asyncio.wait(self._running.values())

    async def close(self) -> None:
        """Cancel what is running (on shutdown); each attempt is closed and its lease freed."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
