"""WebSocket endpoints (the Realtime API): the handshake forwarded, then every frame relayed
both ways as it comes, until either side closes.

The rules of every other path apply to the handshake: the client's headers less hop-by-hop ones
(and less the handshake's own: aiohttp makes the upstream handshake), a route's key in place of
the client's, client keys for this proxy never sent on, the path and query as the client
encoded them. The subprotocols the client offers are offered upstream, and the one the upstream
picks is the client's. A browser's key, which travels as a subprotocol, follows the rule of the
``Authorization`` header: it opens a proxy that requires client keys, and goes on only where
that header would. A handshake the upstream refuses is answered with its status; an upstream
that cannot be reached with a 502. Each side's close code reaches the other. Each side is
pinged every ``websocket_heartbeat_seconds``: one that stops answering is taken for gone
(aiohttp closes it with 1006) and the other is closed with 1011. The upstream side is a
session on the relay pool's seam (``upstream_seam.Upstream.connect``).
"""

from __future__ import annotations

import asyncio

from aiohttp import WSMsgType, web

from compaction_proxy.config.settings import Route
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import error_response, upstream_failed
from compaction_proxy.http.upstream import same_path_upstream_url
from compaction_proxy.security.outbound import upstream_headers
from compaction_proxy.security.tenant import KEY_PROTOCOL_PREFIX
from compaction_proxy.upstream_seam import (
    SocketCall,
    UpstreamBroke,
    UpstreamRefused,
    UpstreamSocket,
    UpstreamUnreachable,
)

HANDSHAKE_HEADERS = (
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions",
    "Sec-WebSocket-Protocol",
)
_NORMAL_CLOSURE = 1000
_ABNORMAL_CLOSURE = 1006  # the other side dropped the connection without a close frame
_UNEXPECTED_CONDITION = 1011
_NOT_SENDABLE = frozenset({1005, _ABNORMAL_CLOSURE, 1015})  # reserved: never in a close frame


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def offered_protocols(header: str) -> tuple[str, ...]:
    """The subprotocols a ``Sec-WebSocket-Protocol`` header offers, in order (pure)."""
    return tuple(p.strip() for p in header.split(",") if p.strip())


def protocols_to_offer(offered: tuple[str, ...], client_key_goes_on: bool) -> tuple[str, ...]:
    """What is offered upstream: the client's subprotocols, less a key one when the client's
    key does not go on (a route with its own key, or a key for this proxy) (pure)."""
    if client_key_goes_on:
        return offered
    return tuple(p for p in offered if not p.startswith(KEY_PROTOCOL_PREFIX))


async def relay_websocket(request: web.Request, route: Route) -> tuple[web.StreamResponse, str]:
    """The client's WebSocket, relayed to ``route``; the response and the outcome to count."""
    services = request.app[SERVICES]
    proxy_keys = services.client_keys.required
    headers = upstream_headers(request.headers, route.api_key_env, proxy_keys=proxy_keys)
    for name in HANDSHAKE_HEADERS:
        headers.popall(name, None)
    settings = services.settings
    limit = settings.max_body_bytes  # a message, as a body, may not be larger
    heartbeat = settings.websocket_heartbeat_seconds or None
    call = SocketCall(
        same_path_upstream_url(route.base, request),
        headers,
        protocols_to_offer(
            offered_protocols(request.headers.get("Sec-WebSocket-Protocol", "")),
            client_key_goes_on=not (route.api_key_env or proxy_keys),
        ),
        max_message_bytes=limit,
        heartbeat=heartbeat,
    )
    try:
        async with services.relay_upstream.connect(call) as upstream:
            chosen = (upstream.protocol,) if upstream.protocol else ()
            client = web.WebSocketResponse(
                protocols=chosen, max_msg_size=limit, heartbeat=heartbeat
            )
            try:
                await client.prepare(request)
                await _relay_both_ways(client, upstream)
            finally:
                # Also when the handler is cancelled: a client that closes its connection
                # right after its close frame does so before the relay has passed it on.
                await upstream.close(close_code_for(client.close_code))
    except UpstreamRefused as refused:
        message = f"The upstream refused the WebSocket handshake ({refused.status})."
        answer = error_response(
            refused.status, message, error_type="upstream_error", code="websocket_refused"
        )
        return answer, f"{refused.status // 100}xx"
    except UpstreamUnreachable as unreachable:
        return upstream_failed(route.base, unreachable.cause), "upstream_unavailable"
    return client, "websocket"


async def _relay_both_ways(client: web.WebSocketResponse, upstream: UpstreamSocket) -> None:
    """Until one side closes; then the other is closed with its code. Closing a side ends
    the relay reading from it (aiohttp wakes a pending receive), so neither is cancelled
    midway unless the client's connection is gone."""
    to_upstream = asyncio.create_task(_to_upstream(client, upstream))
    to_client = asyncio.create_task(_to_client(upstream, client))
    try:
        await asyncio.wait((to_upstream, to_client), return_when=asyncio.FIRST_COMPLETED)
        await upstream.close(close_code_for(client.close_code))  # a no-op if it closed
        await client.close(code=close_code_for(upstream.close_code))
        await asyncio.gather(to_upstream, to_client, return_exceptions=True)
    finally:
        for task in (to_upstream, to_client):
            task.cancel()


def close_code_for(received: int | None) -> int:
    """The code to close the other side with, given the one this side closed with (pure)."""
    if received == _ABNORMAL_CLOSURE:
        return _UNEXPECTED_CONDITION
    if received is None or received in _NOT_SENDABLE:
        return _NORMAL_CLOSURE
    return received


async def _to_upstream(client: web.WebSocketResponse, upstream: UpstreamSocket) -> None:
    """The client's text and binary messages, as they come (pings are answered by each side
    itself), until the client closes or the upstream can take no more."""
    async for message in client:
        if message.type is WSMsgType.TEXT or message.type is WSMsgType.BINARY:
            try:
                await upstream.send(message.data)
            except UpstreamBroke:
                return


async def _to_client(upstream: UpstreamSocket, client: web.WebSocketResponse) -> None:
    """The upstream's messages, as they come, until it closes or the client is gone."""
    while (message := await upstream.receive()) is not None:
        try:
            if isinstance(message, str):
                await client.send_str(message)
            else:
                await client.send_bytes(message)
        except ConnectionError:
            return
