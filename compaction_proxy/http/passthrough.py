"""Every other path under ``/v1/``: forwarded as sent, answered as the upstream answers.

Embeddings, ``models/{id}``, files, audio, images, moderations, batches, ``responses/{id}``, and
whatever a provider adds: any method, any body. A JSON body naming a ``model`` goes to that
model's route (its base URL and key); any other body (a multipart upload, say) is streamed to
the default route without being buffered. The answer is relayed as it arrives, streaming
included. The same header rules as chat apply (hop-by-hop headers dropped, a route's own key
in place of the client's, client keys for this proxy never sent on, the hop marker added),
and a failure to reach the upstream is a 502 or 504 in OpenAI's error shape.

A WebSocket (the Realtime API) is relayed frame by frame (``http.websocket_relay``), routed
by the ``model`` its query names.

Metrics are labelled with the path's template (``/v1/files/{id}/content``), never the path a
client sent, so their label sets stay bounded whatever the clients do.
"""

from __future__ import annotations

import logging
import time

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.config.settings import Route
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.request import check_model_name
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import bad_request_response, upstream_failed
from compaction_proxy.http.intake import check_headers, read_body
from compaction_proxy.http.upstream import (
    ClientGone,
    UpstreamCut,
    client_headers,
    cut_off,
    read_upstream,
    same_path_upstream_url,
)
from compaction_proxy.http.websocket_relay import is_websocket, relay_websocket
from compaction_proxy.metrics import PASSTHROUGH_DURATION, PASSTHROUGH_REQUESTS
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.security.outbound import upstream_headers

log = logging.getLogger(__name__)

# Path segments that name a kind of thing, not one thing; every other segment is an id.
STATIC_SEGMENTS = frozenset(
    {
        "assistants",
        "audio",
        "batches",
        "cancel",
        "chat",
        "completions",
        "compact",
        "content",
        "conversations",
        "edits",
        "embeddings",
        "evals",
        "files",
        "fine_tuning",
        "generations",
        "images",
        "input_items",
        "items",
        "jobs",
        "messages",
        "models",
        "moderations",
        "parts",
        "realtime",
        "responses",
        "runs",
        "sessions",
        "speech",
        "steps",
        "threads",
        "transcriptions",
        "translations",
        "uploads",
        "variations",
        "vector_stores",
        "checkpoints",
        "events",
        "file_batches",
        "containers",
        "graders",
        "alpha",
        "checkpoints_permissions",
        "permissions",
        "output_items",
        "transcription_sessions",
        "client_secrets",
        "calls",
        "videos",
        "remix",
        "skills",
        "versions",
    }
)


def path_template(path: str) -> str:
    """``/v1/files/file-abc/content`` → ``/v1/files/{id}/content`` (pure)."""
    segments = path.removeprefix("/v1/").split("/")
    shown = [s if s in STATIC_SEGMENTS else "{id}" for s in segments if s]
    return "/v1/" + "/".join(shown)


def _model_of(body: bytes) -> str | None:
    """The ``model`` a JSON body names, if it is a JSON object that names one."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


async def passthrough(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    template = path_template(request.path)
    # Counted however it ends. When the client's connection goes, aiohttp cancels the handler:
    # a WebSocket client does so right after its close frame, at the end of its session.
    outcome = "websocket" if is_websocket(request) else "client_disconnected"
    try:
        response, outcome = await _relay(request)
    finally:
        PASSTHROUGH_REQUESTS.labels(path=template, method=request.method, outcome=outcome).inc()
        PASSTHROUGH_DURATION.labels(path=template).observe(time.perf_counter() - started)
    return response


async def _relay(request: web.Request) -> tuple[web.StreamResponse, str]:
    app = request.app
    settings = app[SERVICES].settings
    route: Route = settings.default_route
    data: bytes | aiohttp.StreamReader = request.content
    try:
        check_headers(request.headers)
        if is_websocket(request):
            model = request.query.get("model")  # the Realtime API names it in the query
            if model:
                route = app[SERVICES].policies.for_model(check_model_name(model)).route
            return await relay_websocket(request, route)
        if request.content_type == "application/json" and request.body_exists:
            body = data = await read_body(request, settings.max_body_bytes)
            model = await off_loop_if(is_big(len(body)), lambda: _model_of(body))
            if model is not None:
                route = app[SERVICES].policies.for_model(check_model_name(model)).route
    except BadRequest as error:
        return bad_request_response(error), "bad_request"
    return await _send_on(request, route, data)


async def relay_as_sent(request: web.Request, route: Route, body: bytes) -> web.StreamResponse:
    """Forward a request the proxy has read (``body``) but will not change."""
    response, _ = await _send_on(request, route, body)
    return response


async def _send_on(
    request: web.Request, route: Route, data: bytes | aiohttp.StreamReader
) -> tuple[web.StreamResponse, str]:
    app = request.app
    headers = upstream_headers(
        request.headers, route.api_key_env, proxy_keys=app[SERVICES].client_keys.required
    )
    coding = request.headers.get("Content-Encoding")
    if coding and not isinstance(data, bytes):
        headers["Content-Encoding"] = coding  # streamed as it came, for the upstream to decode
    url = same_path_upstream_url(route.base, request)
    try:
        async with app[SERVICES].http_client.request(
            request.method, url, data=data, headers=headers, allow_redirects=False
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status, reason=upstream.reason, headers=client_headers(upstream)
            )
            try:
                await _stream(request, upstream, response)
            except ClientGone:
                return response, "client_disconnected"
            except UpstreamCut as cut:
                log.warning("upstream %s cut off an answer: %s", route.base, cut.cause)
                cut_off(request)
                return response, "upstream_error"
            return response, f"{upstream.status // 100}xx"
    except (TimeoutError, aiohttp.ClientError) as exc:
        return upstream_failed(route.base, exc), "upstream_unavailable"


async def _stream(
    request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse
) -> None:
    """Write the upstream's answer to the client as it arrives. Once bytes have gone out, an
    upstream that breaks off (``UpstreamCut``) can only be passed on by cutting the client's
    connection."""
    try:
        await response.prepare(request)
    except ConnectionError as exc:
        raise ClientGone(response) from exc
    while True:
        chunk = await read_upstream(upstream, response)
        try:
            if not chunk:
                await response.write_eof()
                return
            await response.write(chunk)
        except ConnectionError as exc:
            raise ClientGone(response) from exc
