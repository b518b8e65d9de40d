"""The product's ``upstream_seam.Upstream``: aiohttp's client session.

The session is the app's (``ops.app``): no cookies kept, its connection pool and timeouts
configured there. Redirects are never followed (an upstream's redirect reaches the client as
it came). aiohttp's exceptions become the seam's own: ``UpstreamUnreachable`` before the
answer's headers, ``UpstreamBroke`` while its body is read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp

from compaction_proxy.upstream_seam import (
    UpstreamAnswer,
    UpstreamBroke,
    UpstreamCall,
    UpstreamUnreachable,
)


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


class AiohttpUpstream:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    @asynccontextmanager
    async def open(self, call: UpstreamCall) -> AsyncIterator[UpstreamAnswer]:
        try:
            response = await self.session.request(
                call.method, call.url, data=call.body, headers=call.headers, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnreachable(exc) from exc
        async with response:  # releases the connection (closes it if the body is unread)
            yield _AiohttpAnswer(response)
