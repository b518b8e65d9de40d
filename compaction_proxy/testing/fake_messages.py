"""The fake provider's Anthropic Messages API: ``POST /v1/messages`` (whole or streamed) and
``/v1/messages/count_tokens``, answering as Anthropic does, errors in its shape.

It asks for a key the way the API does (``x-api-key``, or a bearer token for OAuth) and keeps
every request's headers and body, so tests can see which credentials reached it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

ANTHROPIC_VERSION = "2023-06-01"


def anthropic_error(status: int, kind: str, message: str) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


@dataclass(frozen=True)
class MessagesRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeMessages:
    """State of the Messages endpoints; ``routes()`` serves them."""

    received: list[MessagesRequest] = field(default_factory=list)
    reply_text: str = "Done."

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self._create),
            web.post("/v1/messages/count_tokens", self._count_tokens),
        ]

    async def _read(self, request: web.Request) -> dict[str, Any] | web.Response:
        if not (request.headers.get("x-api-key") or request.headers.get("Authorization")):
            return anthropic_error(401, "authentication_error", "x-api-key header is required")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return anthropic_error(400, "invalid_request_error", "Invalid JSON in request body")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return anthropic_error(400, "invalid_request_error", "model: Field required")
        self.received.append(MessagesRequest(request.path, dict(request.headers), body))
        return body

    @staticmethod
    def input_tokens(body: dict[str, Any]) -> int:
        return len(orjson.dumps(body.get("messages", []))) // 4 + 1

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        return web.json_response({"input_tokens": self.input_tokens(body)})

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        number = len(self.received)
        usage = {"input_tokens": self.input_tokens(body), "output_tokens": 3}
        message = {
            "id": f"msg_fake{number}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": self.reply_text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(message)
        return await self._stream(request, message)

    async def _stream(self, request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        started = {**message, "content": [], "stop_reason": None}
        started["usage"] = {**message["usage"], "output_tokens": 1}
        text = message["content"][0]["text"]
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": started}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            ("ping", {"type": "ping"}),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": message["usage"]["output_tokens"]},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        for name, data in events:
            await response.write(
                b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            )
        await response.write_eof()
        return response
