"""The one seam every call the proxy makes to an upstream goes through: the forwarded request,
its retry, the summary calls, the model list, every request relayed as sent, and WebSocket
sessions (the Realtime API).

Like httpx's transports: service code builds an ``UpstreamCall`` and opens it on an
``Upstream``; what comes back is an ``UpstreamAnswer`` it reads whole or chunk by chunk. A
WebSocket session is a ``SocketCall`` connected on the same ``Upstream``: an
``UpstreamSocket`` that sends and receives whole messages. The product's implementation is
``http.upstream_client.AiohttpUpstream`` (aiohttp's client, no cookies, redirects not
followed); tests give service code an in-memory one (``testing.memory_upstream``), so the
request's life is tested without a socket. A failure to reach the upstream is
``UpstreamUnreachable``, a refused handshake ``UpstreamRefused``, one while reading an answer
or using a session ``UpstreamBroke``: the caller never sees the client library's own
exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import field
from typing import Protocol

from yarl import URL

from compaction_proxy.frozen import frozen


@frozen
class UpstreamCall:
    """One request to an upstream: ``url`` as built by ``security.outbound.upstream_url``."""

    method: str
    url: URL
    headers: Mapping[str, str] = field(default_factory=dict)
    # A body read whole, or one streamed as it arrives (an upload relayed without buffering).
    body: bytes | AsyncIterable[bytes] | None = None


class UpstreamAnswer(Protocol):
    """An upstream's answer, open until its context exits."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes:
        """The whole body (raises ``UpstreamBroke``)."""
        ...

    async def next_chunk(self) -> bytes:
        """The body's next bytes as they arrive, b"" at its end (raises ``UpstreamBroke``)."""
        ...


@frozen
class SocketCall:
    """One WebSocket handshake: ``protocols`` the subprotocols offered, in order;
    ``max_message_bytes`` the largest message taken; a ping every ``heartbeat`` seconds
    (None: never), a peer that stops answering being taken for gone."""

    url: URL
    headers: Mapping[str, str] = field(default_factory=dict)
    protocols: tuple[str, ...] = ()
    max_message_bytes: int = 4 * 1024 * 1024
    heartbeat: float | None = None


# A WebSocket message: text as ``str``, binary as ``bytes``.
SocketMessage = str | bytes


class UpstreamSocket(Protocol):
    """An open WebSocket session with an upstream, until its context exits. Pings and pongs
    are answered by the implementation itself and never seen here."""

    @property
    def protocol(self) -> str | None:
        """The subprotocol the upstream chose, if any."""
        ...

    @property
    def close_code(self) -> int | None:
        """The code the session closed with (1006: dropped without a close frame)."""
        ...

    async def receive(self) -> SocketMessage | None:
        """The next message, None once the session is closed."""
        ...

    async def send(self, message: SocketMessage) -> None:
        """Send one message (raises ``UpstreamBroke`` when the session is gone)."""
        ...

    async def close(self, code: int) -> None:
        """Close with ``code``; nothing when already closed."""
        ...


class Upstream(Protocol):
    def open(self, call: UpstreamCall) -> AbstractAsyncContextManager[UpstreamAnswer]:
        """Send ``call``; the answer's status and headers are in when the context is entered
        (raises ``UpstreamUnreachable``)."""
        ...

    def connect(self, call: SocketCall) -> AbstractAsyncContextManager[UpstreamSocket]:
        """Open the WebSocket session ``call`` asks for; closed when the context exits
        (raises ``UpstreamRefused`` when the handshake is answered with another status,
        ``UpstreamUnreachable`` when nothing answers)."""
        ...


class UpstreamUnreachable(Exception):
    """The upstream could not be reached, or did not answer in time."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause

    @property
    def timed_out(self) -> bool:
        return isinstance(self.cause, TimeoutError)


class UpstreamRefused(Exception):
    """The upstream answered a WebSocket handshake with ``status`` instead of switching."""

    def __init__(self, status: int) -> None:
        super().__init__(f"handshake refused with {status}")
        self.status = status


class UpstreamBroke(Exception):
    """The upstream broke off an answer it had begun (its connection cut, a read timed out)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
