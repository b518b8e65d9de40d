"""The product's ``upstream_seam.Upstream``: aiohttp's client session.

The session is the app's (``ops.app``): no cookies kept, its connection pool and timeouts
configured there. Redirects are never followed (an upstream's redirect reaches the client as
it came). aiohttp's exceptions become the seam's own: ``UpstreamUnreachable`` before the
answer's headers, ``UpstreamRefused`` for a WebSocket handshake answered otherwise,
``UpstreamBroke`` while a body is read or a session's message sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType

import aiohttp
from aiohttp import WSMsgType

from compaction_proxy.upstream_seam import (
    SocketCall,
    SocketMessage,
    UpstreamAnswer,
    UpstreamBroke,
    UpstreamCall,
    UpstreamRefused,
    UpstreamSocket,
    UpstreamUnreachable,
)

_SESSION_OVER = frozenset({WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED})


class _AiohttpAnswer:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def reason(self) -> str | None:
        return self._response.reason

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    @property
    def content_type(self) -> str:
        return self._response.content_type

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroke(exc) from exc

    async def next_chunk(self) -> bytes:
        try:
            return await self._response.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroke(exc) from exc


class _AiohttpSocket:
    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket

    @property
    def protocol(self) -> str | None:
        return self._socket.protocol

    @property
    def close_code(self) -> int | None:
        return self._socket.close_code

    async def receive(self) -> SocketMessage | None:
        while True:
            message = await self._socket.receive()
            if message.type is WSMsgType.TEXT or message.type is WSMsgType.BINARY:
                return message.data  # type: ignore[no-any-return]
            if message.type in _SESSION_OVER:
                return None
            # An error frame: the session closes, and the next receive says so.

    async def send(self, message: SocketMessage) -> None:
        try:
            if isinstance(message, str):
                await self._socket.send_str(message)
            else:
                await self._socket.send_bytes(message)
        except ConnectionError as exc:
            raise UpstreamBroke(exc) from exc

    async def close(self, code: int) -> None:
        await self._socket.close(code=code)


class _OpenedCall:
    """One call's context: the answer once its headers are in; leaving it releases the
    connection (closes it when the body was left unread). A plain context manager: it runs
    once a request, and a generator-based one (an async generator the loop tracks) costs
    several times as much."""

    __slots__ = ("_call", "_response", "_session")

    def __init__(self, session: aiohttp.ClientSession, call: UpstreamCall) -> None:
        self._session = session
        self._call = call
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> UpstreamAnswer:
        call = self._call
        try:
            self._response = await self._session.request(
                call.method, call.url, data=call.body, headers=call.headers, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnreachable(exc) from exc
        return _AiohttpAnswer(self._response)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._response is not None
        await self._response.__aexit__(kind, error, traceback)


class AiohttpUpstream:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    def open(self, call: UpstreamCall) -> _OpenedCall:
        return _OpenedCall(self.session, call)

    @asynccontextmanager
    async def connect(self, call: SocketCall) -> AsyncIterator[UpstreamSocket]:
        try:
            socket = await self.session.ws_connect(
                call.url,
                headers=call.headers,
                protocols=call.protocols,
                max_msg_size=call.max_message_bytes,
                heartbeat=call.heartbeat,
            )
        except aiohttp.WSServerHandshakeError as refused:
            raise UpstreamRefused(refused.status) from refused
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnreachable(exc) from exc
        try:
            yield _AiohttpSocket(socket)
        finally:
            await socket.close()
