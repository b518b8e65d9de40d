"""The providers' own compaction APIs, answered from the proxy's engine (issue: native
compaction on upstreams that lack it; ``config.native_compaction`` says for which routes).

* A Responses request ending with a ``compaction_trigger`` (Codex's remote compaction) is
  answered with exactly one ``compaction`` item, streamed when asked, and
  ``POST /v1/responses/compact`` with the input's user messages and that item. The item
  carries a checkpoint the engine made over everything before the trigger: the request is
  prepared as any other (its committed checkpoints applied, compacted if it is over its
  window), then summarized whole as the admin's manual compaction does (merging an earlier
  checkpoint), and the checkpoint committed, so the proxy's own store holds it too.
* An item the proxy made, sent back in any Responses body on any route (``opened``), becomes
  that checkpoint's message before anything else reads the body; one that does not verify
  for the caller is refused (400 ``invalid_encrypted_content``) and nothing reaches the
  upstream.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.model_policy import ModelPolicy
from compaction_proxy.compaction.outcomes import Outcome
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.summarize import frame, framed_summary_text
from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.conversation.text import text_of
from compaction_proxy.formats.answer_edits import FirstOutputItem
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.compaction_items import (
    SEALED_MARK,
    TRIGGER_TYPE,
    ForgedItem,
    compacted_response,
    is_sealed,
    item_key,
    responses_usage,
    seal,
    summary_message_item,
    trigger_events,
    trigger_response,
    unseal,
)
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.parsing import jsonio
from compaction_proxy.security.tenant import api_key_of, tenant_of
from compaction_proxy.service.forwarded import Forwarded
from compaction_proxy.service.prepare import prepare
from compaction_proxy.service.request_log import RequestLogEntry
from compaction_proxy.service.services import Services
from compaction_proxy.store import StoreUnavailable
from compaction_proxy.store.base import ConversationState

log = logging.getLogger(__name__)

ROUNDS = 4  # summaries merged at most for one compaction (a history one call cannot carry)


@dataclasses.dataclass(frozen=True)
class MadeAnswer:
    """An answer the proxy made itself, in the client's API: what the edge sends."""

    status: int
    body: bytes
    content_type: str = "application/json"


class CompactionUnavailable(Exception):
    """No checkpoint could be made now (the summarizer down, a ceiling reached, ...)."""


async def _key_and_tenant(services: Services, headers: Mapping[str, str]) -> tuple[bytes, str]:
    secret = await services.tenant_secret.get()
    return item_key(secret), tenant_of(secret, api_key_of(headers))


async def opened(services: Services, headers: Mapping[str, str], raw: bytes) -> bytes:
    """``raw`` with each compaction item the proxy made replaced by its checkpoint's message;
    ``raw`` itself when it holds none. BadRequest for one that does not verify for the caller
    (another tenant's, altered, made up)."""
    if SEALED_MARK not in raw:
        return raw
    big = is_big(len(raw))
    try:
        body = await off_loop_if(big, lambda: jsonio.loads(raw))
    except (ValueError, RecursionError):  # not JSON: the format's parse refuses it
        return raw
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list) or not any(is_sealed(item) for item in items):
        return raw
    key, tenant = await _key_and_tenant(services, headers)
    return await off_loop_if(big, lambda: _opened_body(body, items, key, tenant))


def _opened_body(body: dict[str, Any], items: list[Any], key: bytes, tenant: str) -> bytes:
    opened_items: list[Any] = []
    for index, item in enumerate(items):
        if is_sealed(item):
            try:
                summary = unseal(key, tenant, item["encrypted_content"])
            except ForgedItem as exc:
                raise BadRequest(
                    f"Invalid 'input[{index}]': {exc}.",
                    param=f"input[{index}].encrypted_content",
                    code="invalid_encrypted_content",
                ) from exc
            item = summary_message_item(str(frame(summary)["content"]))
        opened_items.append(item)
    return jsonio.dumps({**body, "input": opened_items})


def _from_start(surface: Surface) -> Checkpoint | None:
    """The checkpoint the surface applies from the first body message, if any."""
    return next((c for c in surface.checkpoints if c.start == 0), None)


async def _checkpoint(
    services: Services,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
    headers: Mapping[str, str],
    query: str,
) -> tuple[str, dict[str, Any]]:
    """What the item answering the trigger ending ``client_request`` carries: the summary of
    everything before it, committed as the conversation's checkpoint, and its usage. A
    history too short for a summary to be any smaller is its own compaction, whole."""
    forwarded, _ = await prepare(services, client_request, model_policy, session_id, headers, query)
    job, state = forwarded.job, forwarded.state
    if job is None or state is None:
        raise CompactionUnavailable("the conversation could not be read")
    trigger = len(job.view.body) - 1
    if trigger < 1:
        return "None.", responses_usage(None)
    try:
        return await made_checkpoint(services, job, state, trigger)
    except TooShort:
        return transcript(job.view.body[:trigger]), responses_usage(None)


class TooShort(CompactionUnavailable):
    """The history is too short for a summary of it to be any smaller."""


async def made_checkpoint(
    services: Services, job: CompactionJob, state: ConversationState, end: int
) -> tuple[str, dict[str, Any]]:
    """What an item standing for every body message before position ``end`` carries: one
    checkpoint committed from the first message as far as a summary may reach (merging any
    earlier one; a span never parts a tool call from its result), then the messages after it,
    verbatim; and the usage reported for it."""
    engine = services.engine
    reached = -1  # where the checkpoint from the start ended after the round before
    for _ in range(ROUNDS):
        found = _from_start(job.view.surface(state.records))
        if found is not None and (found.end >= end - 1 or found.end == reached):
            return _carried(job, found, end)
        reached = found.end if found is not None else -1
        made = await triggers.compact_manual(engine, job, state)
        if made.outcome is Outcome.NO_RANGE:
            if found is not None:  # as far as the pairing lets a summary reach
                return _carried(job, found, end)
            region = await triggers.compact_region(engine, job, state, 0, end - 1)
            if isinstance(region, str):
                raise CompactionUnavailable(region)
            made = region
        if made.outcome is Outcome.BUSY:
            state, _ = await engine.wait_and_reload(job)
            continue
        if made.outcome is Outcome.NOT_SMALLER:
            raise TooShort("the history is too short to compact")
        if made.outcome is not Outcome.COMMITTED or made.state is None:
            reason = made.failure.reason if made.failure is not None else made.outcome.value
            raise CompactionUnavailable(f"no summary could be made ({reason})")
        state = made.state
    raise CompactionUnavailable("the history did not fit the summary calls allowed")


def _carried(job: CompactionJob, checkpoint: Checkpoint, end: int) -> tuple[str, dict[str, Any]]:
    text = framed_summary_text(checkpoint.message) or ""
    after = job.view.body[checkpoint.end + 1 : end]
    if after:
        text += f"\n\n## Latest messages, verbatim\n{transcript(after)}"
    usage = {"input_tokens": checkpoint.shadowed_tokens, "output_tokens": checkpoint.tokens}
    return text, responses_usage(usage)


async def prepared_with_compaction(
    services: Services,
    client_request: ClientRequest,
    threshold: int | None,
    model_policy: ModelPolicy,
    session_id: str | None,
    headers: Mapping[str, str],
    query: str,
) -> tuple[Forwarded, RequestLogEntry]:
    """A Responses request that asked for ``context_management`` compaction, on a route
    whose upstream lacks it (``client_request``: without the option). Its history at or over
    ``threshold`` tokens (as the client sent it): everything before its live turn is
    summarized and committed, the request forwarded with that checkpoint, and the answer
    given the compaction item first (``formats.answer_edits.FirstOutputItem``). Below it, or
    no summary to be had: prepared as any request."""
    forwarded, log_entry = await prepare(
        services, client_request, model_policy, session_id, headers, query
    )
    job, state, measured = forwarded.job, forwarded.state, forwarded.measurement
    if threshold is None or job is None or state is None or measured is None:
        return forwarded, log_entry
    sent_tokens = forwarded.tokens_before or measured.tokens
    if sent_tokens < threshold or job.view.live_start < 1:
        return forwarded, log_entry
    try:
        # The item stands for the whole input: the client keeps only what follows it.
        summary, _ = await made_checkpoint(services, job, state, len(job.view.body))
    except CompactionUnavailable as exc:
        log.info("context_management compaction not made: %s", exc)
        return forwarded, log_entry
    forwarded, log_entry = await prepare(
        services, client_request, model_policy, session_id, headers, query
    )
    key, tenant = await _key_and_tenant(services, headers)
    item = seal(key, tenant, summary, int(time.time()))
    return dataclasses.replace(forwarded, answer_edit=FirstOutputItem(item)), log_entry


def transcript(messages: list[Message]) -> str:
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


def _unavailable(reason: str) -> MadeAnswer:
    error = {
        "message": f"The conversation could not be compacted: {reason}. Try again shortly.",
        "type": "server_error",
        "param": None,
        "code": "compaction_unavailable",
    }
    return MadeAnswer(503, orjson.dumps({"error": error}))


async def answer_trigger(
    services: Services,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
    headers: Mapping[str, str],
    query: str,
) -> MadeAnswer:
    """The answer to a Responses request ending with a ``compaction_trigger``: one
    ``compaction`` output item, as events when the request streams."""
    try:
        summary, usage = await _checkpoint(
            services, client_request, model_policy, session_id, headers, query
        )
    except CompactionUnavailable as exc:
        log.warning("compaction_trigger not answered: %s", exc)
        return _unavailable(str(exc))
    except StoreUnavailable as exc:
        log.warning("compaction_trigger not answered: store unavailable (%s)", exc.operation)
        return _unavailable("the proxy's store is unavailable")
    except Exception:
        log.exception("compaction_trigger not answered")
        return _unavailable("the proxy failed to compact it")
    key, tenant = await _key_and_tenant(services, headers)
    now = int(time.time())
    item = seal(key, tenant, summary, now)
    response = trigger_response(f"resp_{uuid.uuid4().hex}", client_request.model, now, item, usage)
    if client_request.stream:
        return MadeAnswer(200, trigger_events(response), "text/event-stream")
    return MadeAnswer(200, orjson.dumps(response))


async def answer_compact(
    services: Services,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
    headers: Mapping[str, str],
    query: str,
) -> MadeAnswer:
    """``POST /v1/responses/compact`` (``client_request`` is its body with a trigger
    appended): the input's user messages, then one ``compaction`` item."""
    try:
        summary, usage = await _checkpoint(
            services, client_request, model_policy, session_id, headers, query
        )
    except CompactionUnavailable as exc:
        log.warning("/responses/compact not answered: %s", exc)
        return _unavailable(str(exc))
    except StoreUnavailable as exc:
        log.warning("/responses/compact not answered: store unavailable (%s)", exc.operation)
        return _unavailable("the proxy's store is unavailable")
    except Exception:
        log.exception("/responses/compact not answered")
        return _unavailable("the proxy failed to compact it")
    key, tenant = await _key_and_tenant(services, headers)
    now = int(time.time())
    item = seal(key, tenant, summary, now)
    items = client_request.body.get("input")
    assert isinstance(items, list)  # made so by the edge (``compact_request_body``)
    sent = [i for i in items if not (isinstance(i, dict) and i.get("type") == TRIGGER_TYPE)]
    answer = compacted_response(f"cmp_{uuid.uuid4().hex}", now, sent, item, usage)
    return MadeAnswer(200, orjson.dumps(answer))
