"""Admin API under ``/admin/``: inspect conversations, compact them by hand.

Every route answers 404 unless ``admin_token`` is configured, and 401 unless the request
carries ``Authorization: Bearer <admin_token>`` (compared in constant time).
"""

from __future__ import annotations

import hmac
import math
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.guards.ceilings import WINDOW_SECONDS as CEILING_WINDOW_SECONDS
from compaction_proxy.compaction.guards.miss_guard import proactive_compaction_stopped
from compaction_proxy.compaction.model_policy import budgets
from compaction_proxy.compaction.outcomes import Outcome, Round
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.range_selection import call_pairs
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.conversation.log_events import Event
from compaction_proxy.conversation.log_view import LoggedRequest, latest_request
from compaction_proxy.conversation.replacements import Checkpoint, ReplacementRecord
from compaction_proxy.conversation.timeline import timeline
from compaction_proxy.formats.wire_formats import wire_format_named
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.metering.meter import counter_for
from compaction_proxy.parsing import jsonio
from compaction_proxy.security.credentials import operator_query
from compaction_proxy.service.pending_writes import shielded
from compaction_proxy.service.prepare import compaction_job
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import ConversationState, Store, StoreUnavailable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_CONVERSATION_ID = re.compile(r"[a-z0-9]{1,80}")
UPSTREAM_AUTH_HEADER = "X-Upstream-Authorization"
UPSTREAM_API_KEY_HEADER = "X-Upstream-Api-Key"  # an Anthropic key, sent as x-api-key
UPSTREAM_QUERY_HEADER = "X-Upstream-Query"  # e.g. Azure's api-version, for the summary call
_OUTCOME_STATUS = {
    Outcome.COMMITTED: 200,
    Outcome.BUSY: 409,
    Outcome.CHANGED: 409,
    Outcome.NO_RANGE: 409,
    Outcome.NOT_SMALLER: 409,
    Outcome.COMMIT_FAILED: 409,
    Outcome.SUMMARY_FAILED: 502,
    Outcome.CEILING: 429,
    Outcome.BREAKER: 503,  # the summary route failed recently; try again after its cooldown
}


# Conversations' contents and an operator's view of them: never kept by a cache on the way,
# never read by a browser as anything but JSON.
_ADMIN_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=jsonio.dumps(data),
        status=status,
        content_type="application/json",
        headers={**_ADMIN_HEADERS, **(headers or {})},
    )


def _problem(status: int, reason: str, **extra: Any) -> web.Response:
    return _json({"reason": reason, **extra}, status)


class BadParameter(Exception):
    """A query parameter the admin API cannot use; answered with 400 and the reason."""


_LOG_CURSOR = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def _limit(request: web.Request, default: int) -> int:
    raw = request.query.get("limit", "")
    if raw == "":
        return default
    # isdecimal alone admits other scripts' digits, which int() reads but no client means.
    if not (raw.isascii() and raw.isdecimal()) or not 1 <= int(raw) <= 1000:
        raise BadParameter(f"limit must be a whole number from 1 to 1000, not {raw[:40]!r}")
    return int(raw)


def _log_cursor(request: web.Request) -> str | None:
    after = request.query.get("after")
    if after is None or after == "":
        return None
    if not _LOG_CURSOR.fullmatch(after):
        raise BadParameter(
            f"after must be a log cursor such as '1700000000000-0', not {after[:40]!r}"
        )
    return after


def admin_only(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        services = request.app[SERVICES]
        token = services.settings.admin_token
        if token is None:
            raise web.HTTPNotFound()
        address = request.remote or ""
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        expected = token.get_secret_value().encode()
        right = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)
        # The right token always works: an address behind a NAT or a load balancer, where
        # anyone can spend its failures, never locks the operator out. The token is long
        # (``MIN_ADMIN_TOKEN_CHARS``), so guessing it is hopeless whatever the rate; the
        # throttle keeps failures few and counted.
        if not right:
            wait = services.admin_guesses.throttled(address)
            services.admin_guesses.refused(address)
            if wait is not None:
                return _json(
                    {"reason": "too many failed admin tokens from this address"},
                    429,
                    {"Retry-After": str(wait)},
                )
            return _json({"reason": "admin token required"}, 401, {"WWW-Authenticate": "Bearer"})
        conversation = request.match_info.get("conversation")
        if conversation is not None and not _CONVERSATION_ID.fullmatch(conversation):
            return _problem(404, "no such conversation")
        # What this process still has to write after its answers is read back too.
        pending = request.app[SERVICES].pending_log_writes
        await (pending.settled(conversation) if conversation else pending.settled_all())
        try:
            return await handler(request)
        except BadParameter as exc:
            return _problem(400, str(exc))
        except StoreUnavailable:
            return _problem(503, "the store is unavailable", outcome="persistence")

    return guarded


def _record_view(record: ReplacementRecord) -> dict[str, Any]:
    if isinstance(record, Checkpoint):
        return {
            "kind": "checkpoint",
            "start": record.start,
            "end": record.end,
            "tokens": record.tokens,
            "shadowed_tokens": record.shadowed_tokens,
        }
    return {
        "kind": "mask" if record.masked else "prune",
        "position": record.position,
        "chars_before": record.chars_before,
        "chars_after": record.chars_after,
    }


def _known(state: ConversationState) -> bool:
    """Whether the store holds anything of the conversation (it answers empty otherwise)."""
    return state.generation > 0 or state.attributes != ConversationAttributes()


SEARCHED_CONVERSATIONS = 1000  # the newest conversations a search looks through


def _offset(request: web.Request) -> int:
    raw = request.query.get("offset", "")
    if raw == "":
        return 0
    if not (raw.isascii() and raw.isdecimal()) or int(raw) > 100_000:
        raise BadParameter(f"offset must be a whole number up to 100000, not {raw[:40]!r}")
    return int(raw)


@admin_only
async def list_conversations(request: web.Request) -> web.StreamResponse:
    """Newest first, ``limit`` from ``offset``; ``q`` keeps those whose session name or id
    contains it (among the newest ``SEARCHED_CONVERSATIONS``)."""
    limit, offset = _limit(request, 50), _offset(request)
    query = request.query.get("q", "").strip().lower()
    store = request.app[SERVICES].store
    if query:
        every = await store.list_conversations(SEARCHED_CONVERSATIONS)
        found = [
            s
            for s in every
            if query in s.conversation or query in (s.attributes.session or "").lower()
        ]
        summaries, more = found[offset : offset + limit], len(found) > offset + limit
    else:
        summaries = await store.list_conversations(limit + 1, offset)
        summaries, more = summaries[:limit], len(summaries) > limit
    return _json(
        {
            "conversations": [
                {
                    "conversation": s.conversation,
                    "session": s.attributes.session,
                    "tenant": s.attributes.tenant,
                    "model": s.attributes.model,
                    "last_seen": s.last_seen,
                    "generation": s.generation,
                    "last_pressure": s.attributes.last_pressure,
                }
                for s in summaries
            ],
            "next_offset": offset + limit if more else None,
        }
    )


@admin_only
async def show_conversation(request: web.Request) -> web.StreamResponse:
    conversation = request.match_info["conversation"]
    state = await request.app[SERVICES].store.load(conversation)
    if not _known(state):
        return _problem(404, "no such conversation")
    services = request.app[SERVICES]
    attributes = state.attributes
    limit = services.settings.checkpoint_miss_limit
    stopped = proactive_compaction_stopped(attributes.misses, limit)
    return _json(
        {
            "conversation": conversation,
            "session": attributes.session,
            "model": attributes.model,
            "tenant": attributes.tenant,
            "last_seen": attributes.last_seen,
            "last_pressure": attributes.last_pressure,
            "proactive_compaction_stopped": stopped,
            "generation": state.generation,
            "lease_owner": state.lease_owner,
            "in_flight": services.in_flight.get(conversation, 0),
            "anchor": state.anchor.__dict__ if state.anchor else None,
            "attributes": attributes.to_stored(),
            "records": [_record_view(r) for r in state.records],
        }
    )


@admin_only
async def conversation_log(request: web.Request) -> web.StreamResponse:
    conversation = request.match_info["conversation"]
    page = await request.app[SERVICES].store.read_log(
        conversation, _log_cursor(request), _limit(request, 100)
    )
    return _json(
        {"events": [{"id": eid, **event} for eid, event in page.events], "next": page.next_cursor}
    )


@admin_only
async def conversation_timeline(request: web.Request) -> web.StreamResponse:
    """Every request of the conversation with its tokens, its compactions and overflows, and
    the window and watermarks its model has now (see ``conversation.timeline``)."""
    conversation = request.match_info["conversation"]
    store = request.app[SERVICES].store
    state = await store.load(conversation)
    if not _known(state):
        return _problem(404, "no such conversation")
    model = state.attributes.model
    limits: dict[str, int | None] = dict.fromkeys(("window", "threshold", "precompact"))
    events = await _all_events(store, conversation)
    if model is not None:
        # The route its requests took: the family of the API they came in decides it.
        api = next((e.get("api") for e in reversed(events) if e.get("type") == "request"), None)
        family = wire_format_named(api).family
        model_policy = request.app[SERVICES].policies.for_model(model, family)
        # The window its own requests had: a limit an upstream stated is its tenant's alone.
        tenant = state.attributes.tenant or ""
        window = request.app[SERVICES].model_window(model_policy, model, tenant)
        if window is not None:
            limits["window"] = window
            if model_policy.policy.auto:  # watermarks only where the proxy compacts by itself
                found = budgets(model_policy.policy, window)
                limits["threshold"] = found.threshold
                limits["precompact"] = found.precompact or None  # 0: precompaction is off
    return _json({"conversation": conversation, "model": model, **limits, **timeline(events)})


async def _all_events(store: Store, conversation: str) -> list[Event]:
    events: list[Event] = []
    cursor: str | None = None
    while True:
        page = await store.read_log(conversation, cursor, 1000)
        events.extend(event for _, event in page.events)
        if page.next_cursor is None:
            return events
        cursor = page.next_cursor


async def _logged(
    request: web.Request,
) -> tuple[str, ConversationState, LoggedRequest, RequestView] | web.Response:
    conversation = request.match_info["conversation"]
    store = request.app[SERVICES].store
    state = await store.load(conversation)
    logged = latest_request(await _all_events(store, conversation))
    tenant = state.attributes.tenant
    if logged is None or tenant is None:
        return _problem(404, "no request of this conversation can be read back from its log")
    view = RequestView.of(
        tenant,
        logged.model,
        [*logged.head, *logged.body],
        None,
        logged.tools,
        conversation=conversation,
    )
    return conversation, state, logged, view


@admin_only
async def conversation_surface(request: web.Request) -> web.StreamResponse:
    found = await _logged(request)
    if isinstance(found, web.Response):
        return found
    conversation, state, logged, view = found
    surface = view.surface(state.records)
    meter, count = request.app[SERVICES].engine.meter, counter_for(logged.model)
    # What each replacing node stands for: a checkpoint's shadowed tokens, a prune's cut.
    replaced: dict[tuple[str, int | None], dict[str, int]] = {
        ("checkpoint", c.start): {"shadowed_tokens": c.shadowed_tokens} for c in surface.checkpoints
    }
    for prune in surface.prunes:
        replaced[("pruned", prune.position)] = {
            "chars_before": prune.chars_before,
            "chars_after": prune.chars_after,
            "masked": prune.masked,
        }
    return _json(
        {
            "conversation": conversation,
            "model": logged.model,
            "generation": state.generation,
            "has_content": logged.has_content,
            "messages": surface.messages,
            # (call, result) node indexes, paired as compaction pairs them
            "tool_pairs": call_pairs(surface.messages),
            "nodes": [
                {
                    "kind": n.kind,
                    "start": n.start,
                    "end": n.end,
                    "tokens": meter.message(n.message, count),
                    **replaced.get((n.kind, n.start), {}),
                }
                for n in surface.nodes
            ],
        }
    )


def _job(
    request: web.Request, logged: LoggedRequest, view: RequestView, query: str
) -> CompactionJob:
    services = request.app[SERVICES]
    wire = wire_format_named(logged.api)
    model_policy = services.policies.for_model(logged.model, wire.family)
    window = services.model_window(model_policy, logged.model, view.tenant)
    credentials = {}
    if UPSTREAM_AUTH_HEADER in request.headers:
        credentials["Authorization"] = request.headers[UPSTREAM_AUTH_HEADER]
    if UPSTREAM_API_KEY_HEADER in request.headers:
        credentials["x-api-key"] = request.headers[UPSTREAM_API_KEY_HEADER]
    return compaction_job(services, view, model_policy, window, credentials, query, wire)


def _round_result(result: Round, generation: int) -> web.Response:
    committed = result.outcome is Outcome.COMMITTED
    body: dict[str, Any] = {
        "outcome": result.outcome.value,
        "tokens_shadowed": result.shadowed_tokens if committed else 0,
        "generation": result.state.generation if committed and result.state else generation,
    }
    if result.span is not None:
        body["span"] = {"start": result.span.start, "end": result.span.end}
    status, headers = _OUTCOME_STATUS[result.outcome], {}
    if result.failure is not None:
        body["reason"] = result.failure.explanation
        if result.failure.reason == "http_429":
            # The upstream rate-limited the summary call: a rate limit, with its stated wait.
            status = 429
            if result.failure.retry_after is not None:
                headers["Retry-After"] = str(max(1, math.ceil(result.failure.retry_after)))
    if result.outcome is Outcome.CEILING:
        # The ceilings count a sliding minute: a call is allowed again within one.
        headers["Retry-After"] = str(CEILING_WINDOW_SECONDS)
    return _json(body, status, headers)


async def _manual(
    request: web.Request,
    run: Callable[[CompactionJob, ConversationState], Coroutine[Any, Any, Round | str]],
) -> web.StreamResponse:
    query = operator_query(request.headers.get(UPSTREAM_QUERY_HEADER, ""))
    if query is None:
        return _problem(400, f"{UPSTREAM_QUERY_HEADER} is not a valid URL query string")
    found = await _logged(request)
    if isinstance(found, web.Response):
        return found
    conversation, state, logged, view = found
    if request.app[SERVICES].in_flight.get(conversation, 0) or state.lease_owner is not None:
        return _problem(409, "a request of this conversation is in flight", outcome="busy")
    if not logged.has_content:
        return _problem(
            409,
            "the log does not hold this conversation's messages (log_content is off, or a "
            "message is longer than log_content_max_chars)",
            outcome="persistence",
        )
    job = _job(request, logged, view, query)
    result: Round | str = await shielded(run(job, state))
    if isinstance(result, str):
        return _problem(400, result)
    return _round_result(result, state.generation)


@admin_only
async def compact(request: web.Request) -> web.StreamResponse:
    engine = request.app[SERVICES].engine
    return await _manual(request, lambda job, state: triggers.compact_manual(engine, job, state))


@admin_only
async def compact_region_endpoint(request: web.Request) -> web.StreamResponse:
    try:
        body = orjson.loads(await request.read())
        start, end = body["start"], body["end"]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)):
            raise TypeError
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return _problem(
            400, 'the body must be {"start": <int>, "end": <int>} (body positions, both inclusive)'
        )
    engine = request.app[SERVICES].engine
    return await _manual(
        request, lambda job, state: triggers.compact_region(engine, job, state, start, end)
    )


def admin_routes() -> list[web.RouteDef]:
    base = "/admin/conversations"
    return [
        web.get(base, list_conversations),
        web.get(base + "/{conversation}", show_conversation),
        web.get(base + "/{conversation}/log", conversation_log),
        web.get(base + "/{conversation}/surface", conversation_surface),
        web.get(base + "/{conversation}/timeline", conversation_timeline),
        web.post(base + "/{conversation}/compact", compact),
        web.post(base + "/{conversation}/compact-region", compact_region_endpoint),
    ]
