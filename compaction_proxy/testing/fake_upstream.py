"""A fake OpenAI-compatible provider for tests, benchmarks and demos.

It behaves like the real thing where the proxy can tell: it counts prompt tokens with tiktoken,
enforces a per-model context window with OpenAI's own overflow body, reports truthful
``usage``, streams real SSE (``stream_options.include_usage`` honoured, ``data: [DONE]`` at the
end) and records every request it receives so tests can assert what was forwarded.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.frozen import frozen
from compaction_proxy.metering.tokenizers import encoding
from compaction_proxy.parsing import jsonio
from compaction_proxy.testing.fake_agent import (
    FileReader,
    Move,
    chat_answer,
    chat_deltas,
    last_user_text,
    text_of_request,
    tool_names,
)
from compaction_proxy.testing.fake_answers import (
    fake_summary,
    is_summary_request,
    overflow_body,
    pairing_error,
    text_of,
)
from compaction_proxy.testing.fake_endpoints import FakeEndpoints
from compaction_proxy.testing.fake_messages import FakeMessages, anthropic_models
from compaction_proxy.testing.fake_responses import FakeResponses
from compaction_proxy.testing.prompt_cache import CacheRead, PromptCaches, chat_prompt

IMAGE_PART_TOKENS = 85
DEFAULT_WINDOW = 128_000

ReplyFunction = Callable[[dict[str, Any]], str]


@frozen
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    prompt_tokens: int = 0
    query: str = ""  # as the proxy encoded it


@frozen
class CannedReply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


@lru_cache(maxsize=65536)
def _count(encoding_name: str, text: str) -> int:
    """Exact token count of one text (cached: replays resend the same texts many times)."""
    return len(encoding(encoding_name).encode(text, disallowed_special=()))


@dataclass
class FakeUpstream:
    """State and behaviour of the fake provider; ``app()`` serves it."""

    windows: dict[str, int] = field(default_factory=dict)
    default_window: int = DEFAULT_WINDOW
    encoding_name: str = "o200k_base"
    reply: ReplyFunction | None = None
    agent: FileReader | None = None  # set by a test: a scripted agent's model (tool calls)
    stream_pieces: int = 4
    stream_delay: float = 0.0
    response_delay: float = 0.0
    count_tokens: bool = True
    keep_requests: bool = True  # off for long benchmarks: every body kept grows without end
    overflow_states_limit: bool = True
    summary_failures: int = 0
    summary_delay: float = 0.0
    summaries_at_once: int = 0  # summary calls being answered now
    most_summaries_at_once: int = 0
    reply_headers: dict[str, str] = field(default_factory=dict)  # on every answer (Set-Cookie)
    received: list[Received] = field(default_factory=list)
    endpoints: FakeEndpoints = field(default_factory=FakeEndpoints)  # every other endpoint
    messages: FakeMessages = field(init=False)  # Anthropic's Messages API
    responses: FakeResponses = field(init=False)
    canned: deque[CannedReply] = field(default_factory=deque)
    disconnects: int = 0
    cut_streams: int = 0  # the next streams to cut off after their first chunk
    overflows: list[bytes] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # requests refused as malformed
    prompt_caches: PromptCaches = field(default_factory=PromptCaches)  # as OpenAI's (counted)
    cache_reads: list[CacheRead] = field(default_factory=list)  # each answered chat prompt's
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.responses = FakeResponses(
            count_text=self.count_text,
            window_of=self.window_of,
            headers=self._headers,
            summary_delay=lambda: self.summary_delay,
            count_tokens=self.count_tokens,
            keep_requests=self.keep_requests,
        )
        self.messages = FakeMessages(
            count_text=self.count_text,
            window_of=self.window_of,
            count_tokens=self.count_tokens,
            keep_requests=self.keep_requests,
        )

    # -- behaviour set by tests -------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """The next chat request gets this answer instead of a completion."""
        self.canned.append(CannedReply(status, body, content_type, headers or {}))

    def window_of(self, model: str) -> int:
        return self.windows.get(model, self.default_window)

    @property
    def chat_requests(self) -> list[Received]:
        """Requests forwarded for the client (summary calls excluded)."""
        return [
            r
            for r in self.received
            if r.path.endswith("/chat/completions")
            and r.body is not None
            and not is_summary_request(r.body)
        ]

    @property
    def summary_requests(self) -> list[Received]:
        """The proxy's summary calls in chat form, then those in Responses form."""
        chat = [r for r in self.received if r.body is not None and is_summary_request(r.body)]
        responses = self.responses
        return chat + [
            Received("/v1/responses", headers, body)
            for body, headers in zip(responses.received, responses.headers_received, strict=True)
            if is_summary_request(body)
        ]

    # -- token counting ----------------------------------------------------------------------

    def count_text(self, text: str) -> int:
        return _count(self.encoding_name, text)

    def prompt_tokens(self, body: Mapping[str, Any]) -> int:
        """OpenAI's counting: 3 tokens per message, 1 per name, 3 to prime the reply."""
        total = 3
        for message in body.get("messages", []):
            total += 3
            for key, value in message.items():
                if value is None:
                    continue
                if key == "content" and isinstance(value, list):
                    for part in value:
                        if isinstance(part, dict) and part.get("type") == "text":
                            total += self.count_text(str(part.get("text", "")))
                        else:
                            total += IMAGE_PART_TOKENS
                elif key == "tool_calls":
                    for call in value:
                        function = call.get("function", {})
                        total += 3 + self.count_text(str(function.get("name", "")))
                        total += self.count_text(str(function.get("arguments", "")))
                else:
                    total += self.count_text(text_of(value))
                    if key == "name":
                        total += 1
        tools = body.get("tools")
        if tools:
            total += self.count_text(text_of(tools))
        return total

    # -- serving -----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.get("/v1/models", self._models),
                *self.endpoints.routes(),
                *self.responses.routes(),
                *self.messages.routes(),
            ]
        )
        return app

    def cached_tokens(self, body: Mapping[str, Any]) -> int:
        """What OpenAI's prompt cache reads of this chat prompt (which it then keeps)."""
        tools = body.get("tools")
        tools_tokens = self.count_text(text_of(tools)) if tools else 0
        parts = chat_prompt(body, lambda m: self.prompt_tokens({"messages": [m]}) - 3, tools_tokens)
        return self.prompt_caches.openai(parts, body.get("prompt_cache_key"))

    def _remember(
        self, request: web.Request, body: dict[str, Any] | None, prompt_tokens: int = 0
    ) -> None:
        if self.keep_requests:
            query = request.rel_url.raw_query_string
            received = Received(request.path, dict(request.headers), body, prompt_tokens, query)
            self.received.append(received)

    def _headers(self) -> dict[str, str]:
        return {
            "x-request-id": f"req_fake_{next(self._ids)}",
            "x-ratelimit-limit-requests": "10000",
            "x-ratelimit-remaining-requests": "9999",
            "openai-processing-ms": "1",
            **self.reply_headers,
        }

    async def _models(self, request: web.Request) -> web.Response:
        self._remember(request, None)
        models = sorted({*self.windows, "fake-model"})
        if "anthropic-version" in request.headers:  # Anthropic's list, in its shape
            return web.json_response(anthropic_models(models))
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in models]
        return web.json_response({"object": "list", "data": data}, headers=self._headers())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """Like a real provider, a body it cannot make sense of gets a 400, never a crash."""
        try:
            return await self._answer_chat(request)
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            refusal = {"message": f"Invalid request: {type(exc).__name__}", "param": None}
            error = {**refusal, "type": "invalid_request_error", "code": None}
            return web.json_response({"error": error}, status=400, headers=self._headers())

    async def _answer_chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = jsonio.loads(raw)  # integers beyond 64 bits arrive as sent
        except ValueError:
            self._remember(request, None)
            return web.json_response(
                {
                    "error": {
                        "message": "bad json",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=400,
            )
        model = str(body.get("model", "fake-model"))
        invalid = pairing_error(body.get("messages"))
        if invalid is not None:
            self._remember(request, body)
            self.rejected.append(invalid)
            refusal = {"message": invalid, "type": "invalid_request_error", "param": "messages"}
            return web.json_response({"error": {**refusal, "code": None}}, status=400)
        # Benchmarks turn counting off so the upstream answers as fast as it can.
        prompt_tokens = self.prompt_tokens(body) if self.count_tokens else len(raw) // 4
        self._remember(request, body, prompt_tokens)
        if self.response_delay:
            await asyncio.sleep(self.response_delay)
        if self.canned:
            canned = self.canned.popleft()
            return web.Response(
                status=canned.status,
                body=canned.body,
                headers={**self._headers(), **canned.headers, "Content-Type": canned.content_type},
            )
        summarizing = is_summary_request(body)
        if summarizing and self.summary_delay:
            self.summaries_at_once += 1
            self.most_summaries_at_once = max(self.most_summaries_at_once, self.summaries_at_once)
            try:
                await asyncio.sleep(self.summary_delay)
            finally:
                self.summaries_at_once -= 1
        if summarizing and self.summary_failures > 0:
            self.summary_failures -= 1
            return web.json_response(
                {
                    "error": {
                        "message": "The server had an error while processing your request.",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=500,
                headers=self._headers(),
            )
        window = self.window_of(model)
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        if prompt_tokens + int(cap) > window:
            error = overflow_body(
                window, prompt_tokens, int(cap), states_limit=self.overflow_states_limit
            )
            self.overflows.append(error)
            return web.Response(
                status=400,
                body=error,
                headers={**self._headers(), "Content-Type": "application/json"},
            )
        finish = "stop"
        if summarizing:
            text = fake_summary(body)
            if cap and self.count_text(text) > int(cap):
                tokens = encoding(self.encoding_name).encode(text, disallowed_special=())
                text = encoding(self.encoding_name).decode(tokens[: int(cap)])
                finish = "length"
        else:
            text = self.reply(body) if self.reply is not None else "ok"
        move: Move = text
        if self.agent is not None and not summarizing:
            messages, tools = body.get("messages"), tool_names(body.get("tools"))
            move = self.agent.move(
                text_of_request(messages), last_user_text(messages), tools, len(self.received)
            )
            text = move if isinstance(move, str) else move.arguments
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": self.count_text(text),
            "total_tokens": prompt_tokens + self.count_text(text),
        }
        if self.count_tokens:
            cached = min(self.cached_tokens(body), prompt_tokens)
            usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
            self.cache_reads.append(CacheRead(summarizing, prompt_tokens, cached))
        completion_id = f"chatcmpl-fake{next(self._ids)}"
        message, finish = chat_answer(move) if finish == "stop" else ({}, finish)
        if body.get("stream"):
            deltas = chat_deltas(move)
            return await self._stream(request, body, completion_id, model, deltas, finish, usage)
        return web.json_response(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message or {"role": "assistant", "content": text},
                        "finish_reason": finish,
                    }
                ],
                "usage": usage,
            },
            headers=self._headers(),
            dumps=lambda obj: orjson.dumps(obj).decode(),
        )

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        completion_id: str,
        model: str,
        deltas: list[dict[str, Any]],
        finish: str,
        usage: dict[str, Any],
    ) -> web.StreamResponse:
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        response = web.StreamResponse(
            headers={**self._headers(), "Content-Type": "text/event-stream"}
        )
        await response.prepare(request)
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            event: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if include_usage:
                event["usage"] = None
            return b"data: " + orjson.dumps(event) + b"\n\n"

        if len(deltas) == 1 and "content" in deltas[0]:  # text, in pieces
            text = str(deltas[0]["content"])
            size = max(1, -(-len(text) // self.stream_pieces))
            deltas = [{"content": text[i : i + size]} for i in range(0, len(text), size)]
        try:
            await response.write(chunk({"role": "assistant", "content": ""}, None))
            if self.cut_streams:
                self.cut_streams -= 1
                assert request.transport is not None
                request.transport.abort()  # the provider's end of the stream, cut short
                return response
            for delta in deltas or [{"content": ""}]:
                if self.stream_delay:
                    await asyncio.sleep(self.stream_delay)
                await response.write(chunk(delta, None))
            await response.write(chunk({}, finish))
            if include_usage:
                final = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                await response.write(b"data: " + orjson.dumps(final) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        await response.write_eof()
        return response


def main(argv: list[str] | None = None) -> None:
    """``python -m compaction_proxy.testing.fake_upstream``: serve the fake provider for demos."""
    import argparse

    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="context window")
    parser.add_argument(
        "--instant", action="store_true", help="skip token counting and keep no requests"
    )
    args = parser.parse_args(argv)
    fake = FakeUpstream(
        default_window=args.window, count_tokens=not args.instant, keep_requests=not args.instant
    )
    print(
        f"fake upstream on http://{args.host}:{args.port}/v1: every model has a "
        f"{args.window}-token window; any API key is accepted",
        flush=True,
    )
    web.run_app(fake.app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
