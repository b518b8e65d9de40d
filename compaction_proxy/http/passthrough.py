"""Every other path under ``/v1/``: forwarded as sent, answered as the upstream answers.

Embeddings, ``models/{id}``, files, audio, images, moderations, batches, ``responses/{id}``, and
whatever a provider adds: any method, any body. A JSON body naming a ``model`` goes to that
model's route (its base URL and key); under a key the proxy holds, every body but a multipart
upload is read first and searched for the stored objects it names (``http.ownership``); any
other body (a multipart upload, say) is streamed to
the default route without being buffered. The answer is relayed as it arrives, streaming
included. The same header rules as chat apply (hop-by-hop headers dropped, a route's own key
in place of the client's, client keys for this proxy never sent on, the hop marker added),
and a failure to reach the upstream is a 502 or 504 in OpenAI's error shape.

A WebSocket (the Realtime API) is relayed frame by frame (``http.websocket_relay``), routed
by the ``model`` its query names. One opened on an endpoint the proxy compacts is not relayed
(``http.socket_endpoint``).

Metrics are labelled with the path's template (``/v1/files/{id}/content``), never the path a
client sent, so their label sets stay bounded whatever the clients do.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.policy import family_route_for
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.request import check_model_name
from compaction_proxy.formats.wire import WireFormat
from compaction_proxy.formats.wire_formats import CHAT
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.compact_endpoint import (
    opened_on_the_way,
    serve_compact,
    serve_count,
    served_count,
    served_here,
)
from compaction_proxy.http.errors import (
    bad_request_outcome,
    bad_request_response,
    caller_format,
    error_response,
    store_unavailable_response,
    upstream_failed,
)
from compaction_proxy.http.forwarding import forward
from compaction_proxy.http.intake import check_headers, read_body
from compaction_proxy.http.ownership import (
    bound_to_the_account,
    claimer,
    holds_key,
    named_in_body,
    owned_answer,
    owned_mode,
)
from compaction_proxy.http.uploads import (
    IdleBoundedBody,
    UploadStalled,
    no_upload_slot,
    stalled,
)
from compaction_proxy.http.upstream import (
    ClientGone,
    UpstreamCut,
    client_headers,
    cut_off,
    same_path_upstream_url,
)
from compaction_proxy.http.websocket_relay import is_websocket, relay_websocket
from compaction_proxy.metrics import PASSTHROUGH_DURATION, PASSTHROUGH_REQUESTS
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.security.account_endpoints import (
    REFUSAL,
    is_stateless,
    refused_account_endpoint,
)
from compaction_proxy.security.object_references import (
    FORMS_NAMING_OBJECTS,
    NamedObject,
    named_in_form,
)
from compaction_proxy.security.outbound import upstream_headers
from compaction_proxy.security.owned_objects import addressed_objects
from compaction_proxy.security.tenant import api_key_of
from compaction_proxy.security.upload_slots import SlotRefusal, client_of
from compaction_proxy.store import StoreUnavailable
from compaction_proxy.upstream_seam import (
    Upstream,
    UpstreamAnswer,
    UpstreamBroke,
    UpstreamCall,
    UpstreamUnreachable,
)

log = logging.getLogger(__name__)

# Reads a whole successful answer's bytes into what the client gets.
Reading = Callable[[bytes], Awaitable[bytes]]

# The API's paths, as label values: a path is counted under its template (ids replaced by
# ``{id}``) when the template is one of these, else as ``other``. A fixed table, so no client
# can add series to the metrics (every distinct path of their own making would be one).
KNOWN_TEMPLATES = frozenset(
    {
        "/v1/models",
        "/v1/models/{id}",
        "/v1/embeddings",
        "/v1/moderations",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/{id}",
        "/v1/chat/completions/{id}/messages",
        "/v1/responses",
        "/v1/responses/compact",
        "/v1/responses/input_tokens",
        "/v1/responses/{id}",
        "/v1/responses/{id}/cancel",
        "/v1/responses/{id}/input_items",
        "/v1/conversations",
        "/v1/conversations/{id}",
        "/v1/conversations/{id}/items",
        "/v1/conversations/{id}/items/{id}",
        "/v1/files",
        "/v1/files/{id}",
        "/v1/files/{id}/content",
        "/v1/uploads",
        "/v1/uploads/{id}/parts",
        "/v1/uploads/{id}/complete",
        "/v1/uploads/{id}/cancel",
        "/v1/batches",
        "/v1/batches/{id}",
        "/v1/batches/{id}/cancel",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/images/variations",
        "/v1/realtime",
        "/v1/realtime/sessions",
        "/v1/realtime/transcription_sessions",
        "/v1/realtime/client_secrets",
        "/v1/realtime/calls",
        "/v1/realtime/calls/{id}",
        "/v1/vector_stores",
        "/v1/vector_stores/{id}",
        "/v1/vector_stores/{id}/search",
        "/v1/vector_stores/{id}/files",
        "/v1/vector_stores/{id}/files/{id}",
        "/v1/vector_stores/{id}/files/{id}/content",
        "/v1/vector_stores/{id}/file_batches",
        "/v1/vector_stores/{id}/file_batches/{id}",
        "/v1/vector_stores/{id}/file_batches/{id}/cancel",
        "/v1/vector_stores/{id}/file_batches/{id}/files",
        "/v1/fine_tuning/jobs",
        "/v1/fine_tuning/jobs/{id}",
        "/v1/fine_tuning/jobs/{id}/cancel",
        "/v1/fine_tuning/jobs/{id}/events",
        "/v1/fine_tuning/jobs/{id}/checkpoints",
        "/v1/assistants",
        "/v1/assistants/{id}",
        "/v1/threads",
        "/v1/threads/runs",
        "/v1/threads/{id}",
        "/v1/threads/{id}/messages",
        "/v1/threads/{id}/messages/{id}",
        "/v1/threads/{id}/runs",
        "/v1/threads/{id}/runs/{id}",
        "/v1/threads/{id}/runs/{id}/cancel",
        "/v1/threads/{id}/runs/{id}/steps",
        "/v1/threads/{id}/runs/{id}/steps/{id}",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/messages/cache_touch",  # Claude Code's prompt-cache keepalive
        "/v1/messages/batches",
        "/v1/messages/batches/{id}",
        "/v1/messages/batches/{id}/results",
        "/v1/messages/batches/{id}/cancel",
        "/v1/evals",
        "/v1/evals/{id}",
        "/v1/evals/{id}/runs",
        "/v1/evals/{id}/runs/{id}",
        "/v1/containers",
        "/v1/containers/{id}",
        "/v1/containers/{id}/files",
        "/v1/containers/{id}/files/{id}",
        "/v1/containers/{id}/files/{id}/content",
        "/v1/videos",
        "/v1/videos/{id}",
        "/v1/videos/{id}/content",
        "/v1/videos/{id}/remix",
    }
)
# Segments that name a kind of thing, not one thing; every other segment is an id.
_KINDS = frozenset(
    segment
    for template in KNOWN_TEMPLATES
    for segment in template.split("/")
    if segment and segment != "{id}"
)
_MAX_SEGMENTS = max(template.count("/") for template in KNOWN_TEMPLATES)
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def path_template(path: str) -> str:
    """``/v1/files/file-abc/content`` → ``/v1/files/{id}/content``; a path of no known
    template → ``other`` (pure)."""
    segments = path.removeprefix("/v1/").split("/")
    if len(segments) >= _MAX_SEGMENTS:
        return "other"
    template = "/v1/" + "/".join(s if s in _KINDS else "{id}" for s in segments if s)
    return template if template in KNOWN_TEMPLATES else "other"


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


def _model_of(parsed: Any) -> str | None:
    """The ``model`` a JSON body names, if it is a JSON object that names one."""
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


def _read_first(request: web.Request, template: str) -> bool:
    """Whether a relayed body is read before it is sent on: a JSON one (to route it by its
    model), and, when the proxy holds keys, any that is not a multipart upload, since an
    upstream may read JSON whatever the content type says, and the stored objects a body
    names must be found before it goes (a multipart form whose fields may name them too)."""
    if request.content_type == "application/json":
        return True
    if not request.app[SERVICES].client_keys.required:
        return False
    return request.content_type != "multipart/form-data" or template in FORMS_NAMING_OBJECTS


def _read_relayed(request: web.Request, body: bytes) -> tuple[Any, list[NamedObject]]:
    """A relayed body read whole: parsed (None when it is not JSON), and the stored objects
    it names, in its JSON or, for a multipart form, in its fields."""
    if request.content_type == "multipart/form-data":
        return None, named_in_form(body, request.headers.get("Content-Type", ""))
    parsed = _json_of(body)
    return parsed, named_in_body(request, body, parsed)


def _json_of(body: bytes) -> Any:
    """The body parsed, or None when it is not JSON (the upstream's to refuse)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def passthrough(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    template = path_template(request.path)
    # Counted however it ends. When the client's connection goes, aiohttp cancels the handler:
    # a WebSocket client does so right after its close frame, at the end of its session.
    outcome = "websocket" if is_websocket(request) else "client_disconnected"
    try:
        response, outcome = await _relay(request)
    finally:
        method = method_label(request.method)
        PASSTHROUGH_REQUESTS.labels(path=template, method=method, outcome=outcome).inc()
        PASSTHROUGH_DURATION.labels(path=template).observe(time.perf_counter() - started)
    return response


async def _relay(request: web.Request) -> tuple[web.StreamResponse, str]:
    app = request.app
    settings = app[SERVICES].settings
    wire = caller_format(request)
    anthropic = wire.family is ApiFamily.ANTHROPIC
    route: Route = settings.anthropic_route if anthropic else settings.default_route
    data: bytes | aiohttp.StreamReader = request.content
    template = path_template(request.path)
    named: list[NamedObject] = []
    try:
        check_headers(request.headers)
        if is_websocket(request):
            model = request.query.get("model")  # the Realtime API names it in the query
            if model:
                route = app[SERVICES].policies.for_model(check_model_name(model)).route
            return await relay_websocket(request, route)
        if request.body_exists and _read_first(request, template):
            body = data = await read_body(request, settings)
            parsed, named = await off_loop_if(
                is_big(len(body)), lambda: _read_relayed(request, body)
            )
            model = _model_of(parsed)
            if model is not None and anthropic:
                route = family_route_for(settings, check_model_name(model), ApiFamily.ANTHROPIC)
            elif model is not None:
                route = app[SERVICES].policies.for_model(check_model_name(model)).route
            data = await opened_on_the_way(request, template, body)
            if served_here(template, request.method, route, parsed):
                refused = await bound_to_the_account(request, route, named)
                if refused is not None:
                    return refused, "refused" if refused.status == 403 else "not_found"
                return await serve_compact(request, data), "served"
            counting = served_count(template, route, parsed)
            if counting is not None:
                refused = await bound_to_the_account(request, route, named)
                if refused is not None:
                    return refused, "refused" if refused.status == 403 else "not_found"
                return await serve_count(request, route, parsed, counting), "served"
    except BadRequest as error:
        return bad_request_response(error, wire=wire), bad_request_outcome(error)
    except StoreUnavailable:  # the tenant secret, to read a compaction item, unknown yet
        return store_unavailable_response(wire), "store_unavailable"
    held = holds_key(request, route)
    if refused_account_endpoint(template, request.method, held, route.account_endpoints):
        return account_endpoint_refused(wire), "refused"
    stateless = is_stateless(template, request.method)
    path_ids = [] if stateless else addressed_objects(request.path, template)
    refused = await bound_to_the_account(request, route, named, path_ids)
    if refused is not None:
        return refused, "refused" if refused.status == 403 else "not_found"
    reading: Reading | None = None
    if owned_mode(request, route) and not stateless:
        reading = functools.partial(owned_answer, request, template)
    relay = app[SERVICES].relay_upstream
    if isinstance(data, bytes) or not request.body_exists:
        return await _send_on(request, route, data, relay, reading)
    # A body streamed as it arrives holds an upstream connection while it does: bounded.
    client = client_of(api_key_of(request.headers), request.remote)
    with app[SERVICES].upload_slots.held(client, request.remote) as refusal:
        if refusal is not None:
            full = refusal is SlotRefusal.POOL
            outcome = "upload_slots_full" if full else "too_many_uploads"
            return no_upload_slot(settings, refusal, wire), outcome
        streamed = IdleBoundedBody.as_configured(data, settings)
        return await _send_on(request, route, streamed, relay, reading)


async def relay_as_sent(
    request: web.Request, route: Route, raw: bytes, named: Sequence[NamedObject]
) -> web.StreamResponse:
    """Forward a request the proxy has read (``raw``, naming ``named``) but will not change:
    a Responses request whose history the provider holds (Responses traffic, on the main
    pool). That history is the account's: under a key the proxy holds, it is an account
    endpoint, served in owned mode only to the tenant that created every object it names."""
    held = holds_key(request, route)
    if refused_account_endpoint("/v1/responses/{id}", "GET", held, route.account_endpoints):
        return account_endpoint_refused(CHAT)
    refused = await bound_to_the_account(request, route, named)
    if refused is not None:
        return refused
    claim = claimer(request, route)
    if claim is None:
        response, _ = await _send_on(request, route, raw, request.app[SERVICES].upstream)
        return response
    reply = await forward(request, route, "/responses", raw, {}, claim)
    return reply.response


def account_endpoint_refused(wire: WireFormat) -> web.Response:
    return error_response(
        403,
        REFUSAL,
        error_type="permission_error",
        code="account_endpoint_refused",
        wire=wire,
    )


async def _send_on(
    request: web.Request,
    route: Route,
    data: bytes | aiohttp.StreamReader | IdleBoundedBody,
    upstream: Upstream,
    reading: Reading | None = None,
) -> tuple[web.StreamResponse, str]:
    """Relay the answer as it arrives; with ``reading``, a successful JSON answer is read
    whole and passed through it first (owned mode)."""
    app, wire = request.app, caller_format(request)
    headers = upstream_headers(
        request.headers,
        route.api_key_env,
        proxy_keys=app[SERVICES].client_keys.required,
        anthropic=wire.family is ApiFamily.ANTHROPIC,
    )
    coding = request.headers.get("Content-Encoding")
    if coding and not isinstance(data, bytes):
        headers["Content-Encoding"] = coding  # streamed as it came, for the upstream to decode
    call = UpstreamCall(request.method, same_path_upstream_url(route.base, request), headers, data)
    try:
        async with upstream.open(call) as answer:
            whole = answer.status < 300 and answer.content_type == "application/json"
            if reading is not None and whole:
                body = await reading(await answer.read())
                headers = client_headers(answer)
                replied = web.Response(status=answer.status, headers=headers, body=body)
                return replied, f"{answer.status // 100}xx"
            response = web.StreamResponse(
                status=answer.status, reason=answer.reason, headers=client_headers(answer)
            )
            try:
                await _stream(request, answer, response)
            except ClientGone:
                return response, "client_disconnected"
            except UpstreamCut as cut:
                log.warning("upstream %s cut off an answer: %s", route.base, cut.cause)
                cut_off(request)
                return response, "upstream_error"
            return response, f"{answer.status // 100}xx"
    except (UpstreamUnreachable, UpstreamBroke, UploadStalled) as exc:
        if isinstance(data, IdleBoundedBody) and data.stalled is not None:
            return stalled(app[SERVICES].settings, data.stalled, wire), "client_timeout"
        cause = exc.cause if isinstance(exc, UpstreamUnreachable | UpstreamBroke) else exc
        return upstream_failed(route.base, cause, wire=wire), "upstream_unavailable"


async def _stream(
    request: web.Request, upstream: UpstreamAnswer, response: web.StreamResponse
) -> None:
    """Write the upstream's answer to the client as it arrives. Once bytes have gone out, an
    upstream that breaks off (``UpstreamCut``) can only be passed on by cutting the client's
    connection."""
    try:
        await response.prepare(request)
    except ConnectionError as exc:
        raise ClientGone(response) from exc
    while True:
        try:
            chunk = await upstream.next_chunk()
        except UpstreamBroke as broke:
            raise UpstreamCut(response, broke.cause) from broke
        try:
            if not chunk:
                await response.write_eof()
                return
            await response.write(chunk)
        except ConnectionError as exc:
            raise ClientGone(response) from exc
