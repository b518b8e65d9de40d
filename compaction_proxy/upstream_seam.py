"""The one seam every call the proxy makes to an upstream goes through: the forwarded request,
its retry, the summary calls, the model list, and every request relayed as sent (WebSocket
sessions aside, which ``http.websocket_relay`` opens on the relay pool itself).

Like httpx's transports: service code builds an ``UpstreamCall`` and opens it on an
``Upstream``; what comes back is an ``UpstreamAnswer`` it reads whole or chunk by chunk. The
product's implementation is ``http.upstream_client.AiohttpUpstream`` (aiohttp's client, no
cookies, redirects not followed); tests give service code an in-memory one
(``testing.memory_upstream``), so the request's life is tested without a socket. A failure to
reach the upstream is ``UpstreamUnreachable``, one while reading its answer ``UpstreamBroke``:
the caller never sees the client library's own exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from yarl import URL


@dataclass(frozen=True)
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


class Upstream(Protocol):
    def open(self, call: UpstreamCall) -> AbstractAsyncContextManager[UpstreamAnswer]:
        """Send ``call``; the answer's status and headers are in when the context is entered
        (raises ``UpstreamUnreachable``)."""
        ...


class UpstreamUnreachable(Exception):
    """The upstream could not be reached, or did not answer in time."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause

    @property
    def timed_out(self) -> bool:
        return isinstance(self.cause, TimeoutError)


class UpstreamBroke(Exception):
    """The upstream broke off an answer it had begun (its connection cut, a read timed out)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
