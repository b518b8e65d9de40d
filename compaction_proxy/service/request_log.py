"""What a request writes to its conversation's session log, and when: after its answer.

Nothing in the log gates forwarding (it is read by operators, never by the request path), so a
request's one round trip before forwarding only reads the conversation's state, and everything
it logs goes with its log entry after the answer, in one round trip: its new messages (and its
context, when that changed), its ``request`` and ``usage`` events, the meter's anchor, its
attributes. What is new is known from the state read before forwarding: the store's logged tip
says which of the body's messages it holds already.

A request that compacts before it is forwarded logs its compaction events before its messages:
in the log they stand, as before, between the previous request and this one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.config.settings import Settings
from compaction_proxy.conversation.log_events import (
    Event,
    MessageEvent,
    context_event,
    first_unlogged,
    message_events,
    request_event,
)
from compaction_proxy.conversation.replacements import ReplacementRecord
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.offload import off_loop_if
from compaction_proxy.service.forwarded import Forwarded
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import ConversationState, Store

LOG_BATCH = 1_000  # messages logged per store call


@frozen
class PendingLog:
    """What a request will log: its body messages from ``start`` (``by_content``: deduplicated
    by content, for a body that rewrote what the log holds), and its context when
    ``new_context``, as of the request (``now``)."""

    view: RequestView
    start: int
    by_content: bool
    new_context: bool
    now: float


@dataclass
class RequestLogEntry:
    """What a request writes to its conversation after its answer, gathered while it is
    served: its pending log, its events (``request`` per attempt, ``overflow``, ``usage``) and
    its attributes, and the replacement records its branch reached (kept while requests
    reach them). Owned by the request; written once, by ``write_request_log``."""

    log: PendingLog
    attributes: ConversationAttributes
    events: list[Event] = field(default_factory=list)
    reached: tuple[ReplacementRecord, ...] = ()
    api: str = "chat"  # the API the request came in (``ClientRequest.api``)

    @classmethod
    def start(
        cls,
        view: RequestView,
        state: ConversationState,
        model: str,
        tenant: str,
        session_id: str | None,
        now: float,
        api: str = "chat",
    ) -> RequestLogEntry:
        """What ``view`` has to log, given the conversation's state read before forwarding.

        A known conversation whose logged tip is not on this body's chain had an early message
        rewritten (or the client forked): only contents the log lacks are logged then, so a
        client that rewrites every turn grows its log by what is new, not by its whole body."""
        start = first_unlogged(view.chain, state.logged_tip)
        by_content = state.logged_tip is not None and start == 0 and bool(view.body)
        context = view.context_digest
        attributes = ConversationAttributes(
            tenant=tenant,
            last_seen=now,
            model=model,
            context=context,
            session=session_id,  # the client's name for it, for operators
        )
        new_context = state.attributes.context != context
        return cls(PendingLog(view, start, by_content, new_context, now), attributes, api=api)

    def add(self, event: Event) -> None:
        self.events.append(event)

    def set(self, attributes: ConversationAttributes) -> None:
        """Write ``attributes`` over those set so far."""
        self.attributes = self.attributes.updated(attributes)

    def add_forwarded(self, forwarded: Forwarded, model: str, route: str, now: float) -> None:
        """The ``request`` event of one attempt: what was forwarded, ``estimated_tokens`` of
        the surface sent, ``client_tokens`` of the client's own messages."""
        job, surface, measurement = forwarded.job, forwarded.surface, forwarded.measurement
        assert job is not None and surface is not None and measurement is not None
        view = job.view
        if forwarded.state is not None:
            self.reached = forwarded.state.records
        self.add(
            request_event(
                now=now,
                model=model,
                route=route,
                generation=forwarded.generation or 0,
                body_length=len(view.body),
                surface_length=len(surface.nodes),
                estimated_tokens=measurement.tokens,
                anchored=measurement.anchored,
                status=str(forwarded.status),  # the StrEnum's value, without its property
                tip=view.chain[-1] if view.chain else None,
                context=view.context_digest,
                digests=view.body_digests if self.log.by_content else None,
                client_tokens=forwarded.tokens_before,
                api=self.api,
            )
        )


def _messages(pending: PendingLog, settings: Settings) -> list[MessageEvent]:
    view = pending.view
    messages = message_events(
        view.body,
        view.chain,
        view.root,
        pending.start,
        log_content=settings.log_content,
        content_limit=settings.log_content_max_chars,
        body_bytes=view.size,
        now=pending.now,
        digests=view.body_digests,
        by_content=pending.by_content,
    )
    if pending.new_context:
        context = context_event(
            view.head,
            view.tools,
            view.context_digest,
            log_content=settings.log_content,
            now=pending.now,
        )
        messages.insert(0, context)
    return messages


async def write_request_log(
    store: Store, settings: Settings, request: RequestLogEntry, anchor: Anchor | None
) -> None:
    """The request's round trip after its answer: its messages, events, ``anchor`` and
    attributes.

    A store logs one call's messages in one atomic step; on Redis that step blocks every other
    client of the server while it runs, so a huge body is logged in batches first (the
    in-process store never waits, so between its batches the loop serves other clients)."""
    pending = request.log
    view = pending.view
    messages = await off_loop_if(view.big, lambda: _messages(pending, settings))
    conversation = view.conversation
    # Where the last batch starts: it goes with the log entry, the batches before it first.
    last = (len(messages) - 1) // LOG_BATCH * LOG_BATCH if messages else 0
    for start_of_batch in range(0, last, LOG_BATCH):
        await store.append(conversation, messages[start_of_batch : start_of_batch + LOG_BATCH])
        await asyncio.sleep(0)
    await store.record_request(
        conversation,
        request.events,
        anchor,
        request.attributes,
        messages[last:],
        request.reached,
    )
