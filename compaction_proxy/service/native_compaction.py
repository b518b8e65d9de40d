"""The providers' own compaction APIs, answered from the proxy's engine where the upstream
lacks them (``config.native_compaction`` says for which routes; each format's shapes are its
adapter's: ``WireFormat.asked_compaction`` and the rest).

* A Responses request ending with a ``compaction_trigger`` (Codex's remote compaction) is
  answered with exactly one ``compaction`` item, streamed when asked, and
  ``POST /v1/responses/compact`` with the input's user messages and that item.
* A request asking for compaction on the way (Responses ``context_management`` compaction,
  Anthropic ``compact_20260112``) at or over its threshold is forwarded with a fresh
  checkpoint, its answer carrying the compaction first (or alone: Anthropic's
  ``pause_after_compaction``); Anthropic's ``clear_tool_uses_20250919`` clears old tool
  results with the client's parameters (``compaction.asked_clearing``) and the answer says
  what went. The upstream never sees the option.
* A compaction is made as the admin's manual compaction does: the request prepared as any
  other (its checkpoints applied, compacted if it is over its window), then everything before
  its live turn (or trigger) summarized, merging an earlier checkpoint, and committed, so the
  proxy's store holds it too. The client gets it sealed (``formats.sealed_checkpoints``).
* A sealed checkpoint sent back in any body of those formats on any route (``opened``)
  becomes the checkpoint before anything else reads the body; one that does not verify for
  the caller is refused (400) and nothing reaches the upstream.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence

import orjson

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.asked_clearing import cleared_tool_uses
from compaction_proxy.compaction.guards.breaker import FailureScope, Wait
from compaction_proxy.compaction.guards.ceilings import WINDOW_SECONDS as CEILING_WINDOW_SECONDS
from compaction_proxy.compaction.model_policy import ModelPolicy
from compaction_proxy.compaction.outcomes import Outcome, Round
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.summarize import frame, framed_summary_text
from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.conversation.text import text_of
from compaction_proxy.formats.asked_compaction import AskedCompaction, ClearedToolUses
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.sealed_checkpoints import (
    SEALED_MARK,
    MadeCompaction,
    seal,
    sealing_key,
    unseal,
)
from compaction_proxy.formats.wire import WireFormat
from compaction_proxy.formats.wire_formats import RESPONSES
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.overflow import NAMELESS_ERROR, ErrorKind
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.parsing import jsonio
from compaction_proxy.security.tenant import api_key_of, tenant_of
from compaction_proxy.service.forwarded import Forwarded, status_of
from compaction_proxy.service.prepare import prepare
from compaction_proxy.service.request_log import RequestLogEntry
from compaction_proxy.service.services import Services
from compaction_proxy.store import StoreUnavailable
from compaction_proxy.store.base import ConversationState

log = logging.getLogger(__name__)

ROUNDS = 4  # summaries merged at most for one compaction (a history one call cannot carry)


@frozen
class MadeAnswer:
    """An answer the proxy made itself, in the client's API: what the edge sends."""

    status: int
    body: bytes
    content_type: str = "application/json"
    retry_after: int | None = None  # seconds, sent as ``Retry-After``

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": self.content_type}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


class CompactionUnavailable(Exception):
    """No checkpoint could be made now (the summarizer down, ...)."""


class CompactionRateLimited(CompactionUnavailable):
    """A rate limit: the summary calls a minute at their ceiling (the caller's own, or its
    route's), or the upstream rate-limiting the caller's summary calls. Answered as one (429),
    as the admin API does, not as the proxy being down; ``retry_after``: the seconds to wait,
    when the proxy knows them (the ceiling's minute, or the upstream's stated wait);
    ``kind``: the type and code the upstream gave the caller's own key (its spent quota is
    ``insufficient_quota``, which clients stop on rather than retry), else a rate limit's."""

    def __init__(
        self, reason: str, retry_after: int | None = None, kind: ErrorKind = NAMELESS_ERROR
    ) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.kind = kind


def summarizer_refusal(made: Round, wait: Wait | None) -> CompactionUnavailable:
    """Why a round that committed no checkpoint (``made``: its summary call failed, the
    breaker let none go, ...) leaves the client without a compaction, as the client should
    read it (pure). ``wait``: the caller's own back-off after the round, if any. The upstream
    rate-limiting the caller's summary calls is a rate limit (429), with its wait when it
    stated one (a quota spent states none: the client hears at once, not after waiting out
    the breaker's own cooldown) and the type and code it gave the caller's key, so a spent
    quota reads as one; anything else is the service's (503), as the compaction endpoint an
    upstream lacks would fail at once without the proxy."""
    reason = made.failure.reason if made.failure is not None else made.outcome.value
    if wait is not None and wait.scope is FailureScope.RATE_LIMITED:
        seconds = max(1, math.ceil(wait.seconds)) if wait.stated else None
        said = f" ({wait.kind.code})" if wait.kind.code else ""
        return CompactionRateLimited(
            f"the upstream is rate-limiting this key's summary calls{said}", seconds, wait.kind
        )
    return CompactionUnavailable(f"no summary could be made ({reason})")


async def _key_and_tenant(services: Services, headers: Mapping[str, str]) -> tuple[bytes, str]:
    secret = await services.tenant_secret.get()
    return sealing_key(secret), tenant_of(secret, api_key_of(headers))


async def opened(
    services: Services, headers: Mapping[str, str], raw: bytes, wire: WireFormat
) -> bytes:
    """``raw`` with each sealed checkpoint the proxy gave the caller put back as the
    checkpoint (``WireFormat.opened_checkpoints``); ``raw`` itself when it holds none.
    BadRequest for one that does not verify for the caller (another tenant's, altered, made
    up)."""
    if SEALED_MARK not in raw:
        return raw
    big = is_big(len(raw))
    try:
        body = await off_loop_if(big, lambda: jsonio.loads(raw))
    except (ValueError, RecursionError):  # not JSON: the format's parse refuses it
        return raw
    key, tenant = await _key_and_tenant(services, headers)

    def checkpoint_text(token: str) -> str:
        return str(frame(unseal(key, tenant, token))["content"])

    replaced = await off_loop_if(big, lambda: wire.opened_checkpoints(body, checkpoint_text))
    return raw if replaced is None else jsonio.dumps(replaced)


def _from_start(surface: Surface) -> Checkpoint | None:
    """The checkpoint the surface applies from the first body message, if any."""
    return next((c for c in surface.checkpoints if c.start == 0), None)


class TooShort(CompactionUnavailable):
    """The history is too short for a summary of it to be any smaller."""


def transcript(messages: Sequence[Message]) -> str:
    """A short history as text, one message after another, each under its role."""
    lines = []
    for message in messages:
        role = message.get("role", "user")
        text = text_of(message.get("content")) or ""
        calls = message.get("tool_calls") or []
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                text += f"\n[called {function.get('name')} with {function.get('arguments')}]"
        lines.append(f"{role}: {text.strip()}")
    return "\n\n".join(lines)


def _unavailable(wire: WireFormat, reason: str) -> MadeAnswer:
    message = f"The conversation could not be compacted: {reason}. Try again shortly."
    body = wire.error_body(503, message, error_type="server_error", code="compaction_unavailable")
    return MadeAnswer(503, orjson.dumps(body))


def _rate_limited(
    wire: WireFormat, reason: str, retry_after: int | None, kind: ErrorKind = NAMELESS_ERROR
) -> MadeAnswer:
    """A rate limit, as the client's API says one, with when to come back if known, of the
    kind the upstream named (OpenAI's rate limit unless it named one)."""
    message = f"The conversation could not be compacted now: {reason}."
    body = wire.error_body(
        429,
        message,
        error_type=kind.error_type or "requests",
        code=kind.code or "rate_limit_exceeded",
    )
    return MadeAnswer(429, orjson.dumps(body), retry_after=retry_after)


@frozen
class NativeCompaction:
    """One request's compaction, asked for through a provider's API: the request, its policy,
    and what the client sent besides (for the summary call's credentials, as ``prepare``
    takes them)."""

    services: Services
    client_request: ClientRequest
    model_policy: ModelPolicy
    session_id: str | None
    headers: Mapping[str, str]
    query: str

    async def _prepared(self) -> tuple[Forwarded, RequestLogEntry]:
        return await prepare(
            self.services,
            self.client_request,
            self.model_policy,
            self.session_id,
            self.headers,
            self.query,
        )

    async def trigger_answer(self) -> MadeAnswer:
        """The answer to a request ending with a ``compaction_trigger``: the compaction
        alone, as events when the request streams."""
        made = await self._whole_or_unavailable()
        return made if isinstance(made, MadeAnswer) else self._compaction_answer(made)

    async def compact_answer(self) -> MadeAnswer:
        """``POST /v1/responses/compact`` (the request: its body as
        ``ResponsesFormat.compact_request`` made it): the input's user messages, then one
        ``compaction`` item."""
        made = await self._whole_or_unavailable()
        if isinstance(made, MadeAnswer):
            return made
        return MadeAnswer(200, RESPONSES.compacted_answer(self.client_request, made))

    async def prepared_as_asked(
        self, asked: AskedCompaction
    ) -> tuple[Forwarded, RequestLogEntry, MadeAnswer | None]:
        """A request that asked for compaction or clearing on the way, on a route whose
        upstream lacks it (the request: without the option). At or over ``asked.threshold``
        tokens (its history as the client sent it), everything before its live turn is
        compacted and the request forwarded with that checkpoint, or, asked to pause,
        answered with the compaction alone (the third value). Tool uses and thinking are
        cleared as asked. The answer gets what was done (``WireFormat.compaction_edit``). No
        summary to be had: prepared as any request."""
        forwarded, log_entry = await self._prepared()
        job, state, measured = forwarded.job, forwarded.state, forwarded.measurement
        if job is None or state is None or measured is None:
            return forwarded, log_entry, None
        made = None
        sent_tokens = forwarded.tokens_before or measured.tokens
        if asked.threshold is not None and sent_tokens >= asked.threshold and job.view.live_start:
            job = dataclasses.replace(job, summary_instructions=asked.instructions)
            try:
                # It stands for the whole input: the client keeps only what follows it.
                made = await self._made(job, state, len(job.view.body))
            except CompactionUnavailable as exc:
                log.info("compaction asked on the way not made: %s", exc)
            if made is not None and asked.pause:
                return forwarded, log_entry, self._compaction_answer(made)
            if made is not None:
                forwarded, log_entry = await self._prepared()
        cleared = None
        if asked.clear_tool_uses is not None:
            forwarded, cleared = await self._cleared(forwarded, asked)
        wire, sent = self.client_request.wire, forwarded.payload
        big = is_big(len(sent))
        payload, applied = await off_loop_if(
            big, lambda: wire.cleared_as_asked(sent, asked, cleared)
        )
        edit = wire.compaction_edit(made, applied, asked)
        return dataclasses.replace(forwarded, payload=payload, answer_edit=edit), log_entry, None

    def _compaction_answer(self, made: MadeCompaction) -> MadeAnswer:
        request = self.client_request
        body = request.wire.compaction_answer(request.model, made, request.stream)
        return MadeAnswer(200, body, "text/event-stream" if request.stream else "application/json")

    async def _whole_or_unavailable(self) -> MadeCompaction | MadeAnswer:
        """``_whole``, or the 503 that says why there is none (429 at a ceiling)."""
        wire = self.client_request.wire
        try:
            return await self._whole()
        except CompactionRateLimited as exc:
            log.info("a compaction asked for not made: %s", exc)
            return _rate_limited(wire, str(exc), exc.retry_after, exc.kind)
        except CompactionUnavailable as exc:
            log.warning("a compaction asked for not made: %s", exc)
            return _unavailable(wire, str(exc))
        except StoreUnavailable as exc:
            log.warning("a compaction asked for not made: store unavailable (%s)", exc.operation)
            return _unavailable(wire, "the proxy's store is unavailable")
        except Exception:
            log.exception("a compaction asked for not made")
            return _unavailable(wire, "the proxy failed to compact it")

    async def _whole(self) -> MadeCompaction:
        """The compaction of everything before the trigger ending the request. A history too
        short for a summary to be any smaller is its own compaction, whole."""
        forwarded, _ = await self._prepared()
        job, state = forwarded.job, forwarded.state
        if job is None or state is None:
            raise CompactionUnavailable("the conversation could not be read")
        trigger = len(job.view.body) - 1
        if trigger < 1:
            return await self._sealed_text("None.")
        try:
            return await self._made(job, state, trigger)
        except TooShort:
            return await self._sealed_text(transcript(job.view.body[:trigger]))

    async def _made(self, job: CompactionJob, state: ConversationState, end: int) -> MadeCompaction:
        """The compaction of every body message before position ``end``, sealed for the
        caller: one checkpoint committed from the first message as far as a summary may reach
        (merging any earlier one; a span never parts a tool call from its result), then the
        messages after it, verbatim."""
        engine = self.services.engine
        reached = -1  # where the checkpoint from the start ended after the round before
        for _ in range(ROUNDS):
            found = _from_start(job.view.surface(state.records))
            if found is not None and (found.end >= end - 1 or found.end == reached):
                return await self._sealed(job, found, end)
            reached = found.end if found is not None else -1
            made = await triggers.compact_manual(engine, job, state)
            if made.outcome is Outcome.NO_RANGE:
                if found is not None:  # as far as the pairing lets a summary reach
                    return await self._sealed(job, found, end)
                region = await triggers.compact_region(engine, job, state, 0, end - 1)
                if isinstance(region, str):
                    raise CompactionUnavailable(region)
                made = region
            if made.outcome is Outcome.BUSY:
                state, _ = await engine.wait_and_reload(job)
                continue
            if made.outcome is Outcome.NOT_SMALLER:
                raise TooShort("the history is too short to compact")
            if made.outcome is Outcome.CEILING:
                # The ceilings count a sliding minute: a call is allowed again within one.
                raise CompactionRateLimited(
                    "its summary calls a minute are at their ceiling", CEILING_WINDOW_SECONDS
                )
            if made.outcome in (Outcome.SUMMARY_FAILED, Outcome.BREAKER):
                wait = engine.breaker.waiting(job.summarizer, job.view.tenant)
                raise summarizer_refusal(made, wait)
            if made.outcome is not Outcome.COMMITTED or made.state is None:
                raise summarizer_refusal(made, None)
            state = made.state
        raise CompactionUnavailable("the history did not fit the summary calls allowed")

    async def _sealed(self, job: CompactionJob, checkpoint: Checkpoint, end: int) -> MadeCompaction:
        text = framed_summary_text(checkpoint.message) or ""
        after = job.view.body[checkpoint.end + 1 : end]
        if after:
            text += f"\n\n## Latest messages, verbatim\n{transcript(after)}"
        return await self._sealed_text(text, checkpoint.shadowed_tokens, checkpoint.tokens)

    async def _sealed_text(self, text: str, taken: int = 0, given: int = 0) -> MadeCompaction:
        key, tenant = await _key_and_tenant(self.services, self.headers)
        return MadeCompaction(text, seal(key, tenant, text, int(time.time())), taken, given)

    async def _cleared(
        self, forwarded: Forwarded, asked: AskedCompaction
    ) -> tuple[Forwarded, ClearedToolUses | None]:
        """``forwarded`` with tool uses cleared as asked, and what went."""
        job, state, surface = forwarded.job, forwarded.state, forwarded.surface
        measured, clear = forwarded.measurement, asked.clear_tool_uses
        if job is None or state is None or surface is None or measured is None or clear is None:
            return forwarded, None
        engine = self.services.engine
        done = await cleared_tool_uses(engine, job, state, surface, measured, clear)
        if done is None:
            return forwarded, None
        cleared_surface, cleared = done
        request = self.client_request
        payload = await off_loop_if(
            job.view.big, lambda: request.wire.payload(request, cleared_surface)
        )
        replaced = dataclasses.replace(
            forwarded,
            payload=payload,
            surface=cleared_surface,
            measurement=await engine.measure(job, state, cleared_surface),
            status=status_of(cleared_surface),
            tokens_before=forwarded.tokens_before or measured.tokens,
        )
        return replaced, cleared
