"""A wire format's endpoint over a WebSocket: each request frame served as the HTTP request it
stands for, and the answer's events sent back a frame each.

OpenAI serves Responses over a WebSocket at ``/v1/responses``, and Codex on its built-in
provider opens one before anything else. Relayed as it came, a whole session would pass the
proxy by: nothing compacted, logged or counted. Here each frame becomes a request to this very
process (the address the client reached, the client's handshake headers, ``POST`` on the same
path and query), which authenticates, parses, compacts, forwards, logs and counts it as any
other; this module knows nothing of that. What the socket adds (a frame continuing the
connection's last response, a prewarm) is the format's ``SocketDialect``.

Frames are read as they come (so pings are answered during a long turn, and a client that
leaves is seen at once) and served one at a time, in order. When the client goes, the turn in
flight is given up, as a request whose client hangs up is.

A format with no dialect refuses the handshake with 426: Codex takes that for "this server
speaks HTTP here" and sends the same turn as a ``POST`` at once (refused with any other status,
it retries over about 6 s first). A plain ``GET`` on the path goes on as every other ``/v1/``
request (``http.passthrough``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import WSMsgType, web

from compaction_proxy.formats.answer_edits import EventStream, event_fields, event_object
from compaction_proxy.formats.wire import (
    FrameRefused,
    SocketDialect,
    SocketRequest,
    SocketResponse,
    WireFormat,
)
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import caller_format, error_response
from compaction_proxy.http.passthrough import passthrough
from compaction_proxy.http.websocket_relay import HANDSHAKE_HEADERS, is_websocket
from compaction_proxy.metrics import SOCKET_SESSIONS
from compaction_proxy.parsing import jsonio
from compaction_proxy.security.loopback import LOOPBACK_CLIENT_HEADER
from compaction_proxy.security.outbound import HOP_BY_HOP
from compaction_proxy.security.tenant import api_key_of

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FRAMES_WAITING = 4  # frames read ahead of the one being served

# The handshake's headers that are the connection's, not the requests': hop by hop, the
# handshake's own, and those describing a body (each frame's request has its own).
_NOT_FORWARDED = (
    HOP_BY_HOP
    | {name.lower() for name in HANDSHAKE_HEADERS}
    | {"host", "content-length", "content-type", "content-encoding", "accept-encoding"}
    | {LOOPBACK_CLIENT_HEADER.lower()}  # a client's own is never taken for the vouch
)


def refused_websocket(wire: WireFormat) -> web.Response:
    """The answer to a handshake on an endpoint served over HTTP alone, in the caller's error
    shape: 426, the status Codex falls back to HTTP on without retrying."""
    message = (
        "This endpoint is served over HTTP only, where its requests are compacted: "
        "send the request as a POST instead of over a WebSocket."
    )
    return error_response(426, message, code="websocket_not_served", wire=wire)


def socket_endpoint(wire: WireFormat) -> Handler:
    """``GET`` on ``wire``'s endpoint: a WebSocket served frame by frame, when ``wire`` is
    served over one."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not is_websocket(request):
            return await passthrough(request)
        if wire.socket is None:
            return refused_websocket(caller_format(request))
        SOCKET_SESSIONS.labels(format=wire.name).inc()
        return await _serve_socket(request, wire.socket)

    handle.__name__ = f"{wire.name}_socket"
    return handle


def loopback_headers(handshake: Mapping[str, str]) -> dict[str, str]:
    """The headers each frame's request carries: the client's handshake headers less the
    connection's own, its key as ``Authorization`` where a browser sent it as a subprotocol
    (pure)."""
    headers = {k: v for k, v in handshake.items() if k.lower() not in _NOT_FORWARDED}
    named = {k.lower() for k in headers}
    if "authorization" not in named and "x-api-key" not in named:
        key = api_key_of(handshake)
        if key:
            headers["Authorization"] = f"Bearer {key}"
    headers["Content-Type"] = "application/json"
    return headers


def _own_address(request: web.Request) -> tuple[str, aiohttp.BaseConnector | None]:
    """The base URL of the address the client reached this process at, and the connector to
    reach it by."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(sockname, str):  # a Unix socket
        return "http://localhost", aiohttp.UnixConnector(path=sockname)
    if not isinstance(sockname, tuple):
        raise RuntimeError(f"no address to reach this process at: {sockname!r}")
    host, port = str(sockname[0]), int(sockname[1])
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}", None


async def _serve_socket(request: web.Request, dialect: SocketDialect) -> web.StreamResponse:
    settings = request.app[SERVICES].settings
    heartbeat = settings.websocket_heartbeat_seconds or None
    client = web.WebSocketResponse(max_msg_size=settings.max_body_bytes, heartbeat=heartbeat)
    await client.prepare(request)
    base, connector = _own_address(request)
    headers = loopback_headers(request.headers)
    # Each frame's request is named by this client's address, not this process's.
    vouch = request.app[SERVICES].loopback.header_for(request.remote or "")
    headers[LOOPBACK_CLIENT_HEADER] = vouch
    frames: asyncio.Queue[str | None] = asyncio.Queue(maxsize=FRAMES_WAITING)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        turns = _Turns(client, dialect, session, base + request.raw_path, headers)
        reader = asyncio.ensure_future(_read_frames(client, frames))
        server = asyncio.ensure_future(turns.serve(frames))
        try:
            await asyncio.wait((reader, server), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, server):
                task.cancel()
            for ended in await asyncio.gather(reader, server, return_exceptions=True):
                if isinstance(ended, Exception) and not isinstance(ended, ConnectionError):
                    log.error("serving a WebSocket failed", exc_info=ended)
    return client


async def _read_frames(client: web.WebSocketResponse, frames: asyncio.Queue[str | None]) -> None:
    """Every text frame, in order, then None: the client closed. A binary frame is no
    request: it is queued as one that cannot be read. Past ``FRAMES_WAITING`` frames waiting
    for their turn, the client's are left unread until one is served."""
    async for message in client:
        if message.type is WSMsgType.TEXT:
            await frames.put(message.data)
        elif message.type is WSMsgType.BINARY:
            await frames.put("")
    await frames.put(None)


class _Turns:
    """One connection's frames, served in order; its last response kept for the next."""

    def __init__(
        self,
        client: web.WebSocketResponse,
        dialect: SocketDialect,
        session: aiohttp.ClientSession,
        url: str,
        headers: Mapping[str, str],
    ) -> None:
        """``headers``: each frame's request's (``loopback_headers``, and the vouch)."""
        self._client, self._dialect, self._session, self._url = client, dialect, session, url
        self._headers = headers
        self._last: SocketResponse | None = None

    async def serve(self, frames: asyncio.Queue[str | None]) -> None:
        while (frame := await frames.get()) is not None:
            try:
                body = self._dialect.request_body(jsonio.loads(frame))
            except FrameRefused as refused:
                await self._refuse(400, "invalid_request_error", str(refused))
                continue
            except (ValueError, RecursionError):
                await self._refuse(400, "invalid_request_error", "Invalid event: not JSON.")
                continue
            sent = self._dialect.http_request(body, self._last)
            here = self._dialect.answered_here(sent.body)
            if here is not None:
                for event in here:
                    await self._send(event, sent)
                continue
            try:
                ended = await self._forward(sent)
            except aiohttp.ClientError as failed:
                if self._client.closed:  # the client left: nobody to tell
                    return
                log.warning("serving a WebSocket frame over HTTP failed: %r", failed)
                ended = False  # the answer broke off on its way here
            if not ended:
                await self._refuse(502, "api_error", "The answer ended before the response did.")

    async def _refuse(self, status: int, kind: str, message: str) -> None:
        error = {"type": kind, "code": None, "message": message, "param": None}
        await self._send(self._dialect.error_event(status, {"error": error}, {}), None)

    async def _send(self, event: dict[str, Any], sent: SocketRequest | None) -> None:
        await self._client.send_str(orjson.dumps(event).decode())
        if sent is not None:
            self._last = self._dialect.continued_by(event, sent) or self._last

    async def _pass_on(self, event: bytes, sent: SocketRequest) -> bool:
        """One server-sent event as a frame, its data as it came; whether it ended the
        answer, by its JSON as the client reads it (only an event that may is parsed)."""
        _, data = event_fields(event)
        if data is None:  # a comment, a keep-alive: nothing for a socket
            return False
        # A text frame holds UTF-8: bytes that are not (a stream cut inside a character) are
        # replaced, as a client reading the stream as text would.
        await self._client.send_str(data.decode(errors="replace"))
        parsed = event_object(data) if self._dialect.may_end(data) else None
        if parsed is None:
            return False
        self._last = self._dialect.continued_by(parsed, sent) or self._last
        return self._dialect.ends(parsed)

    async def _post(self, body: bytes) -> aiohttp.ClientResponse:
        """``body`` to this process's endpoint, on a kept-alive connection. One that this
        process was closing as the request was written to it (after an answer the upstream cut
        short) took none of it: the request goes again on a new one. Nothing else is sent
        twice, which could bill it twice."""
        try:
            return await self._session.post(self._url, data=body, headers=self._headers)
        except aiohttp.ClientConnectionResetError:
            return await self._session.post(self._url, data=body, headers=self._headers)

    async def _forward(self, sent: SocketRequest) -> bool:
        """``sent`` to this process's endpoint, its answer back as events; whether one of
        them ended it."""
        async with await self._post(sent.raw) as answer:
            if answer.status < 400 and answer.content_type == "text/event-stream":
                # Up to the event that ends the answer: a socket client reads no further for
                # this frame, so anything after it would be read as the next frame's.
                events = EventStream()
                async for chunk in answer.content.iter_any():
                    for event in events.feed(chunk):
                        if await self._pass_on(event, sent):
                            return True
                return await self._pass_on(events.close(), sent)
            parsed = _json_or_text(await answer.read())
            if answer.status < 400 and isinstance(parsed, dict):  # a whole answer, not a stream
                await self._send({"type": "response.completed", "response": parsed}, sent)
                return True
            status = answer.status if answer.status >= 400 else 502
            headers = {k.lower(): v for k, v in answer.headers.items()}
            await self._send(self._dialect.error_event(status, parsed, headers), sent)
            return True


def _json_or_text(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")
