"""The fake upstream as the request-path benches run it (``--instant``): in every wire format it
answers without counting tokens or modelling a cache, and keeps no body, so a bench of any
format measures the proxy in the middle, not the fake behind it."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from compaction_proxy.testing.fake_upstream import FakeUpstream

HISTORY = [
    {"role": "user", "content": "Fix the failing test in tests/test_dates.py. " * 40},
    {"role": "assistant", "content": "Reading it."},
    {"role": "user", "content": "It fails on leap years. " * 30},
]

# path, headers, body, the usage field of the prompt's tokens
FORMS: dict[str, tuple[str, dict[str, str], dict[str, Any], str]] = {
    "chat": (
        "/v1/chat/completions",
        {"Authorization": "Bearer k"},
        {"model": "m", "messages": HISTORY},
        "prompt_tokens",
    ),
    "responses": (
        "/v1/responses",
        {"Authorization": "Bearer k"},
        {"model": "m", "input": HISTORY, "store": False},
        "input_tokens",
    ),
    "messages": (
        "/v1/messages",
        {"x-api-key": "k", "anthropic-version": "2023-06-01"},
        {"model": "m", "max_tokens": 64, "messages": HISTORY},
        "input_tokens",
    ),
}


def kept(fake: FakeUpstream) -> int:
    return len(fake.received) + len(fake.responses.received) + len(fake.messages.received)


def cache_reads(fake: FakeUpstream) -> int:
    return len(fake.cache_reads) + len(fake.responses.cache_reads) + len(fake.messages.cache_reads)


async def usage_of(fake: FakeUpstream, aiohttp_server: Any, form: str) -> dict[str, Any]:
    path, headers, body, _ = FORMS[form]
    server: TestServer = await aiohttp_server(fake.app())
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.make_url(path), data=orjson.dumps(body), headers=headers) as answer,
    ):
        assert answer.status == 200, await answer.text()
        usage: dict[str, Any] = (await answer.json())["usage"]
        return usage


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_an_instant_fake_keeps_nothing_and_sizes_the_prompt_by_its_bytes(
    form: str, aiohttp_server: Any
) -> None:
    instant = FakeUpstream(count_tokens=False, keep_requests=False)
    counting = FakeUpstream()
    sized = await usage_of(instant, aiohttp_server, form)
    counted = await usage_of(counting, aiohttp_server, form)
    field = FORMS[form][3]
    assert kept(instant) == 0 and cache_reads(instant) == 0
    assert kept(counting) == 1 and cache_reads(counting) == 1
    # A quarter of the prompt's bytes (the body's; for Responses its input items'), where the
    # counting fake gives the tokenizer's count.
    body = FORMS[form][2]
    prompt = body["input"] if form == "responses" else body
    assert sized[field] == len(orjson.dumps(prompt)) // 4 != counted[field]
