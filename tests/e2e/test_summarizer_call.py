"""The summary call's failure classes against a provider that answers badly."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from compaction_proxy.compaction.summarize import (
    SummaryFailed,
    call_summarizer,
    frame,
    framed_summary_text,
)
from compaction_proxy.http.upstream_client import AiohttpUpstream


def completion(content: Any, finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "message": {"role": "assistant", "content": content, **message},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3},
    }


ANSWERS: dict[str, Any] = {
    "ok": (200, completion("## Current Work\nfine")),
    "parts": (
        200,
        completion(
            [{"type": "text", "text": "## Current Work\n"}, {"type": "text", "text": "parts"}]
        ),
    ),
    "length": (200, completion("## Current Work\ncut of", finish="length")),
    "empty": (200, completion("   ")),
    "tools-only": (
        200,
        completion(
            None,
            tool_calls=[
                {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        ),
    ),
    "error": (500, {"error": {"message": "boom", "type": "server_error"}}),
    "garbage": (200, "not a completion"),
}


@pytest.fixture
async def provider(aiohttp_server: Any) -> str:
    async def answer(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name == "slow":
            await asyncio.sleep(5)
        if name == "redirect":  # to an answer that would do, were it followed
            return web.Response(status=307, headers={"Location": "/ok/chat/completions"})
        status, body = ANSWERS.get(name, (200, {}))
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_post("/{name}/chat/completions", answer)
    server = await aiohttp_server(app)
    return str(server.make_url(""))


async def summarize(base: str, name: str, timeout: float = 2.0) -> str:
    async with aiohttp.ClientSession() as session:
        url = URL(f"{base}/{name}/chat/completions")
        body = {"model": "m", "messages": []}
        summary = await call_summarizer(AiohttpUpstream(session), url, {}, body, timeout)
        return summary.text


async def test_text_is_kept(provider: str) -> None:
    assert await summarize(provider, "ok") == "## Current Work\nfine"
    assert await summarize(provider, "parts") == "## Current Work\nparts"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("length", "length"),
        ("empty", "empty"),
        ("tools-only", "empty"),
        ("error", "http_500"),
        ("garbage", "malformed"),
        ("redirect", "http_307"),
    ],
)
async def test_unusable_answers_are_failures(provider: str, name: str, reason: str) -> None:
    with pytest.raises(SummaryFailed) as caught:
        await summarize(provider, name)
    assert caught.value.reason == reason


async def test_a_slow_summary_times_out(provider: str) -> None:
    with pytest.raises(SummaryFailed) as caught:
        await summarize(provider, "slow", timeout=0.2)
    assert caught.value.reason == "timeout"


async def test_unreachable_summarizer_is_a_failure() -> None:
    with pytest.raises(SummaryFailed) as caught:
        await summarize("http://127.0.0.1:9", "ok")
    assert caught.value.reason == "unreachable"


def test_framing_wraps_the_summary_after_a_preamble() -> None:
    message = frame("## Current Work\nx\n")
    assert message["role"] == "user"
    content = message["content"]
    assert content.index("continue the task") < content.index("<compacted-summary>")
    assert content.endswith("<compacted-summary>\n## Current Work\nx\n</compacted-summary>")
    assert framed_summary_text(message) == "## Current Work\nx"
