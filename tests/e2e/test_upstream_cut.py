"""A stream the upstream cuts off is the upstream's failure, not the client's.

The client sees the stream end short (its connection is cut, as the upstream's was: bytes are
already out, so no error body can follow); the request counts as ``upstream_error``, not a
client disconnect, and the proxy says so in one log line, with no traceback.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import RunningProxy
from tests.helpers import counter

pytest.importorskip("openai")

import openai

REQUESTS = "compaction_proxy_requests_total"
DISCONNECTS = "compaction_proxy_client_disconnects_total"


async def test_a_stream_the_upstream_cuts_is_an_upstream_error_said_in_one_line(
    proxy: RunningProxy, fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    fake.cut_streams = 1
    route = "*"
    errors = counter(REQUESTS, route=route, outcome="upstream_error")
    gone = counter(DISCONNECTS, route=route)
    caplog.set_level(logging.INFO)
    received: list[str] = []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-x", max_retries=0) as client:
        with pytest.raises(Exception):  # noqa: B017  # the transport's error, whichever it is
            stream = await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "tell me a story"}],
                stream=True,
            )
            async for chunk in stream:
                received.extend(choice.delta.content or "" for choice in chunk.choices)
    for _ in range(100):  # counted when the handler returns, after the client saw the cut
        if counter(REQUESTS, route=route, outcome="upstream_error") > errors:
            break
        await asyncio.sleep(0.02)
    assert counter(REQUESTS, route=route, outcome="upstream_error") == errors + 1
    assert counter(DISCONNECTS, route=route) == gone
    said = [r for r in caplog.records if "cut off" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
