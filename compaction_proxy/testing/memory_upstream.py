"""An in-memory ``upstream_seam.Upstream``: service code tested without a socket.

A test scripts the answers (``MemoryUpstream.answer``: a status, headers and body chunks, or
an exception to raise) and reads back the calls the code made (``calls``). Unscripted calls
are answered by ``fallback`` when given, else with a 500 naming the path. WebSocket
handshakes are answered by ``sessions`` (a ``MemorySocket`` per handshake, or an exception),
else with an echoing session; each handshake is in ``socket_calls``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from multidict import CIMultiDict

from compaction_proxy.upstream_seam import (
    SocketCall,
    SocketMessage,
    UpstreamAnswer,
    UpstreamBroke,
    UpstreamCall,
    UpstreamSocket,
    UpstreamUnreachable,
)


@dataclass
class MemoryAnswer:
    """A scripted answer: its chunks are handed out one per ``next_chunk``; ``broken_after``
    chunks, the answer breaks off (``UpstreamBroke``)."""

    status: int = 200
    chunks: Sequence[bytes] = (b"{}",)
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    reason: str | None = None
    broken_after: int | None = None

    def opened(self) -> _OpenAnswer:
        return _OpenAnswer(self)


class _OpenAnswer:
    def __init__(self, script: MemoryAnswer) -> None:
        self._script = script
        self._chunks = deque(script.chunks)
        self._given = 0
        self.headers: CIMultiDict[str] = CIMultiDict(script.headers)
        self.headers.setdefault("Content-Type", script.content_type)

    @property
    def status(self) -> int:
        return self._script.status

    @property
    def reason(self) -> str | None:
        return self._script.reason

    @property
    def content_type(self) -> str:
        return self._script.content_type

    async def next_chunk(self) -> bytes:
        if self._script.broken_after is not None and self._given >= self._script.broken_after:
            raise UpstreamBroke(ConnectionResetError("the scripted answer breaks off"))
        if not self._chunks:
            return b""
        self._given += 1
        return self._chunks.popleft()

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.next_chunk():
            parts.append(chunk)
        return b"".join(parts)


Responder = Callable[[UpstreamCall], Awaitable[MemoryAnswer]]


class MemorySocket:
    """A scripted WebSocket session: ``say`` queues a message for the proxy to receive,
    ``hang_up`` closes the session from the upstream's side; what the proxy sent is in
    ``sent``, the code it closed with in ``closed_with``. With ``echo``, every message sent
    is said back."""

    def __init__(self, protocol: str | None = None, echo: bool = False) -> None:
        self.protocol = protocol
        self.echo = echo
        self.sent: list[SocketMessage] = []
        self.close_code: int | None = None
        self.closed_with: int | None = None
        self._incoming: asyncio.Queue[SocketMessage | None] = asyncio.Queue()

    def say(self, message: SocketMessage) -> None:
        self._incoming.put_nowait(message)

    def hang_up(self, code: int) -> None:
        self.close_code = code
        self._incoming.put_nowait(None)

    async def receive(self) -> SocketMessage | None:
        if self.close_code is not None and self._incoming.empty():
            return None
        return await self._incoming.get()

    async def send(self, message: SocketMessage) -> None:
        if self.close_code is not None:
            raise UpstreamBroke(ConnectionResetError("the session is closed"))
        self.sent.append(message)
        if self.echo:
            self.say(message)

    async def close(self, code: int) -> None:
        if self.close_code is None:
            self.close_code = self.closed_with = code
            self._incoming.put_nowait(None)


class MemoryUpstream:
    def __init__(self, fallback: Responder | None = None) -> None:
        self.calls: list[UpstreamCall] = []
        self._scripted: deque[MemoryAnswer | BaseException] = deque()
        self._fallback = fallback
        self.socket_calls: list[SocketCall] = []
        self.sessions: deque[MemorySocket | BaseException] = deque()

    def answer(self, *answers: MemoryAnswer | BaseException) -> None:
        """Answer the next calls with ``answers``, in order (an exception: unreachable)."""
        self._scripted.extend(answers)

    @asynccontextmanager
    async def open(self, call: UpstreamCall) -> AsyncIterator[UpstreamAnswer]:
        self.calls.append(call)
        if self._scripted:
            scripted = self._scripted.popleft()
        elif self._fallback is not None:
            scripted = await self._fallback(call)
        else:
            scripted = MemoryAnswer(500, (f"no answer scripted for {call.url.path}".encode(),))
        if isinstance(scripted, BaseException):
            raise UpstreamUnreachable(scripted)
        yield scripted.opened()

    @asynccontextmanager
    async def connect(self, call: SocketCall) -> AsyncIterator[UpstreamSocket]:
        self.socket_calls.append(call)
        session = self.sessions.popleft() if self.sessions else MemorySocket(echo=True)
        if isinstance(session, BaseException):
            if isinstance(session, OSError | TimeoutError):
                raise UpstreamUnreachable(session)
            raise session  # UpstreamRefused, as scripted
        try:
            yield session
        finally:
            await session.close(1000)
