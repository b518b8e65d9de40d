"""The edge's side of forwarding: one attempt sent upstream through the ``upstream_seam``, a
successful stream relayed to the client as it arrives, and ``EdgeLink``, what the service's
request life (``service.exchange``) asks of the client's connection."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.answer_edits import AnswerEdit
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire import WireFormat
from compaction_proxy.formats.wire_formats import CHAT
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import upstream_failed
from compaction_proxy.http.ownership import bound_to_the_account, claimer
from compaction_proxy.http.upstream import (
    Claim,
    ClientGone,
    UpstreamCut,
    UsageScanner,
    buffered_response,
    claim_created,
    client_headers,
    client_query,
    cut_off,
    is_event_stream,
    relay_stream,
)
from compaction_proxy.metrics import UPSTREAM_DURATION, UPSTREAM_SHARE_WAITS, child
from compaction_proxy.security.object_references import NamedObject
from compaction_proxy.security.outbound import upstream_headers, upstream_url
from compaction_proxy.security.tenant import api_key_of
from compaction_proxy.security.upstream_shares import client_named
from compaction_proxy.service.exchange import AnswerBegan, Refusal, Reply
from compaction_proxy.service.forwarded import Forwarded
from compaction_proxy.service.native_compaction import MadeAnswer
from compaction_proxy.upstream_seam import UpstreamBroke, UpstreamCall, UpstreamUnreachable

log = logging.getLogger(__name__)

EdgeReply = Reply[web.StreamResponse]


def _observe(route: Route, started: float) -> None:
    child(UPSTREAM_DURATION, route.model).observe(time.perf_counter() - started)


async def forward(
    request: web.Request,
    route: Route,
    path: str,
    payload: bytes,
    extra_headers: Mapping[str, str],
    claim: Claim | None = None,
    *,
    wire: WireFormat = CHAT,
    edit: AnswerEdit | None = None,
    answer_began: AnswerBegan | None = None,
) -> EdgeReply:
    """Send ``payload`` to ``path`` (``/chat/completions``, ``/responses``) of the route. A
    successful stream is relayed to the client as it arrives; any other answer is returned
    whole, so the caller may still decide to retry. With ``claim``, what a successful answer
    creates is claimed before the client has it (``http.ownership``). With ``edit``, a
    successful answer reaches the client as it edits it (``formats.answer_edits``).
    ``answer_began`` is told the upstream's status before any of its answer is read."""
    services = request.app[SERVICES]
    headers = upstream_headers(
        request.headers,
        route.api_key_env,
        proxy_keys=services.client_keys.required,
        anthropic=wire.family is ApiFamily.ANTHROPIC,
    )
    headers.setdefault("Content-Type", "application/json")
    url = upstream_url(route.base, path, client_query(request))
    # The client's share of the pool: past it, a request waits for one of its own.
    client = client_named(api_key_of(request.headers), request.remote)
    if not services.upstream_shares.took(client):
        UPSTREAM_SHARE_WAITS.inc()
        await services.upstream_shares.turn(client)
    started = time.perf_counter()
    try:
        async with services.upstream.open(UpstreamCall("POST", url, headers, payload)) as upstream:
            if answer_began is not None:
                answer_began(upstream.status)
            reply_headers = client_headers(upstream)
            reply_headers.update(extra_headers)
            if upstream.status < 400 and is_event_stream(upstream):
                scanner = UsageScanner(wants_created=claim is not None)
                try:
                    editor = edit.editor() if edit is not None else None
                    streamed = await relay_stream(
                        request, upstream, reply_headers, scanner, claim, editor
                    )
                except ClientGone as gone:
                    if not gone.answered:
                        log.info("the client went away mid-answer")
                    _observe(route, started)
                    # Leaving the upstream's context releases its connection.
                    return Reply(
                        gone.response, upstream.status, scanner.usage, client_gone=not gone.answered
                    )
                except UpstreamCut as cut:
                    log.warning("upstream %s cut off a stream: %s", route.base, cut.cause)
                    _observe(route, started)
                    cut_off(request)
                    return Reply(cut.response, upstream.status, scanner.usage, upstream_cut=True)
                _observe(route, started)
                return Reply(streamed, upstream.status, scanner.usage)
            body = await upstream.read()
            _observe(route, started)
            if edit is not None and upstream.status < 300:
                body = edit.whole(body)
            response = buffered_response(upstream.status, reply_headers, body)
            if upstream.status >= 400:
                return Reply(response, upstream.status, error_body=body)
            if claim is not None:
                await claim_created(claim, body)
            return Reply(response, upstream.status, answer=body)
    except (UpstreamUnreachable, UpstreamBroke) as exc:
        return Reply(upstream_failed(route.base, exc.cause, wire=wire), 0)
    finally:
        services.upstream_shares.give_back(client)


class EdgeLink:
    """The client's connection, as the service's request life sees it (``ClientLink``)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def query(self) -> str:
        return client_query(self.request)

    async def refusal(
        self, route: Route, named: Sequence[NamedObject]
    ) -> Refusal[web.StreamResponse] | None:
        refused = await bound_to_the_account(self.request, route, named)
        if refused is None:
            return None
        return Refusal(refused, "refused" if refused.status == 403 else "not_found")

    def made_here(self, answer: MadeAnswer) -> web.StreamResponse:
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)

    async def send(
        self,
        route: Route,
        client_request: ClientRequest,
        forwarded: Forwarded,
        answer_began: AnswerBegan | None = None,
    ) -> EdgeReply:
        wire = client_request.wire
        # Owned mode: what the provider keeps of the answer is the caller's.
        claim = claimer(self.request, route) if client_request.stored else None
        return await forward(
            self.request,
            route,
            wire.upstream_path,
            forwarded.payload,
            forwarded.compaction_headers(),
            claim,
            wire=wire,
            edit=forwarded.answer_edit,
            answer_began=answer_began,
        )
