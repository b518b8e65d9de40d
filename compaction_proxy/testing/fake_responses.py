"""The fake provider's Responses API (``POST /v1/responses``, and over a WebSocket).

Like the real one where the proxy can tell the difference: input items (messages, function
calls and their outputs, reasoning items), pairing enforced (an output needs its call, a call
its output, a reasoning item the item after it), a window enforced with the Responses overflow
error, usage as ``input_tokens``/``output_tokens``, and real SSE events when streamed. The
output items of a response made with ``store`` on (the default) are kept, and an input's
``item_reference`` is read as the item it names (a 404 in the API's words for one not kept).
With ``tools`` in the request and a user message or a function output last, it calls the
first tool (an agent loop for tests to drive), ``tool_rounds`` times in all; otherwise it
answers with text.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio
from compaction_proxy.testing.fake_agent import (
    FileReader,
    Move,
    ShellCall,
    last_user_text,
    responses_item,
    text_of_request,
    tool_names,
)
from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request
from compaction_proxy.testing.prompt_cache import CacheRead, PromptCaches, PromptPart

CountText = Callable[[str], int]

OVERFLOW_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in value
        )
    return jsonio.dumps(value).decode()


def input_items(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    return [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])


def pairing_problem(items: list[Any]) -> str | None:
    """What the real API refuses about how items follow each other, in its words."""
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            return f"Invalid type for 'input[{index}]': expected an object."
        kind = item.get("type", "message")
        if kind == "function_call":
            calls[str(item.get("call_id"))] = index
        elif kind == "function_call_output":
            call_id = str(item.get("call_id"))
            if call_id not in calls:
                return f"No tool call found for function call output with call_id {call_id}."
            answered.add(call_id)
        elif kind == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else None
            if following is None:
                return (
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
    for call_id in calls:
        if call_id not in answered:
            return f"No tool output found for function call {call_id}."
    return None


@dataclass
class FakeResponses:
    count_text: CountText
    window_of: Callable[[str], int]
    headers: Callable[[], dict[str, str]] = dict  # a provider's own headers on every answer
    summary_delay: Callable[[], float] = float  # seconds a summary call takes (0: none)
    received: list[dict[str, Any]] = field(default_factory=list)  # bodies, in order
    headers_received: list[dict[str, str]] = field(default_factory=list)  # theirs, in order
    stream_pieces: int = 4
    tool_rounds: int = 3  # tool calls it makes in all before it answers with text
    calls_made: int = 0
    agent: FileReader | None = None  # set by a test: a scripted agent's model instead
    refused: list[str] = field(default_factory=list)  # pairing problems, in its words
    overflows: list[int] = field(default_factory=list)  # prompts refused as over the window
    sockets: int = 0  # WebSocket connections opened
    stored_items: dict[str, dict[str, Any]] = field(default_factory=dict)  # by id
    cut_streams: int = 0  # the next streams to cut off after their first event
    prompt_caches: PromptCaches = field(default_factory=PromptCaches)  # prefix caching
    cache_reads: list[CacheRead] = field(default_factory=list)  # each answered prompt's
    # Off for benchmarks, as the chat fake's: prompts sized by their bytes, nothing cached,
    # no body kept, so the upstream answers as fast as it can and holds no growing list.
    count_tokens: bool = True
    keep_requests: bool = True
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def forwarded(self) -> list[dict[str, Any]]:
        """The bodies forwarded for the client (the proxy's summary calls left out)."""
        return [body for body in self.received if not is_summary_request(body)]

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/responses", self._create), web.get("/v1/responses", self._socket)]

    def input_tokens(self, body: dict[str, Any]) -> int:
        total = 3
        if isinstance(body.get("instructions"), str):
            total += 3 + self.count_text(body["instructions"])
        for item in input_items(body):
            total += 3
            for key in ("content", "output", "arguments", "name", "encrypted_content"):
                if item.get(key) is not None:
                    total += self.count_text(_text(item[key]))
        if body.get("tools"):
            total += self.count_text(jsonio.dumps(body["tools"]).decode())
        return total

    def _cached(self, body: dict[str, Any], items: list[Any]) -> int:
        """The prompt's tokens OpenAI's cache would read: tools, instructions, then items."""
        tools, instructions = body.get("tools"), body.get("instructions")
        parts = []
        if tools:
            parts.append(PromptPart(tools, self.input_tokens({"tools": tools, "input": []}) - 3))
        if isinstance(instructions, str):
            parts.append(PromptPart(instructions, 3 + self.count_text(instructions)))
        parts += [PromptPart(i, self.input_tokens({"input": [i]}) - 3) for i in items]
        return self.prompt_caches.openai(parts, body.get("prompt_cache_key"))

    async def _create(self, request: web.Request) -> web.StreamResponse:
        """Like a real provider, a body it cannot make sense of gets a 400, never a crash."""
        try:
            return await self._answer(request)
        except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as exc:
            return _error(400, f"Invalid request: {type(exc).__name__}", None, None, self.headers())

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = jsonio.loads(await request.read())
        if self.keep_requests:
            self.headers_received.append(dict(request.headers))
        reply = await self._reply(body)
        if isinstance(reply, _Refusal):
            return _error(reply.status, reply.message, reply.param, reply.code, self.headers())
        # Encoded before a stream starts: what the answer echoes of the request may not encode
        # (an integer past 64 bits), and that must be a 400, not a stream cut after its headers.
        encoded = orjson.dumps(reply)
        if body.get("stream"):
            return await self._stream(request, reply)
        return web.Response(body=encoded, content_type="application/json", headers=self.headers())

    async def _reply(self, body: dict[str, Any]) -> dict[str, Any] | _Refusal:
        """The response to ``body``, or why it is refused."""
        if self.keep_requests:
            self.received.append(body)
        model = str(body.get("model"))
        items = input_items(body)
        for index, item in enumerate(items):
            if isinstance(item, dict) and item.get("type") == "item_reference":
                kept = self.stored_items.get(str(item.get("id")))
                if kept is None:
                    return _Refusal(_not_kept(item.get("id")), "input", None, status=404)
                items[index] = kept
        stateful = body.get("previous_response_id") is not None
        problem = None if stateful else pairing_problem(items)
        if problem is not None:
            self.refused.append(problem)
            return _Refusal(problem, "input", None)
        if self.count_tokens:  # references read as their items
            tokens = self.input_tokens({**body, "input": items})
        else:
            tokens = len(jsonio.dumps(items)) // 4
        cap = int(body.get("max_output_tokens") or 0)
        if tokens + cap > self.window_of(model):
            self.overflows.append(tokens)
            return _Refusal(OVERFLOW_MESSAGE, "input", "context_length_exceeded")
        if is_summary_request(body) and self.summary_delay():
            await asyncio.sleep(self.summary_delay())
        number = next(self._ids)
        item = responses_item(self._move(body, items, number), number)
        produced = self.count_text(_text(item.get("content") or item.get("arguments")))
        cached = 0
        if self.count_tokens:
            cached = min(self._cached(body, items), tokens)
            self.cache_reads.append(CacheRead(is_summary_request(body), tokens, cached))
        usage = {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": produced,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens + produced,
        }
        if body.get("store") is not False:
            self.stored_items[item["id"]] = item
        return _response(f"resp_fake{number}", model, body, [item], usage)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        """Responses over a WebSocket, as OpenAI serves them: each ``response.create`` frame
        answered by the events of a stream, a frame each, or by an ``error`` event. A frame
        naming the connection's last response (``previous_response_id``) is read after that
        response's input and output, which the connection keeps (``store: false`` or not)."""
        socket = web.WebSocketResponse()
        if not socket.can_prepare(request).ok:
            return _error(405, "Use POST or a WebSocket.", None, None, self.headers())
        await socket.prepare(request)
        self.sockets += 1
        last: tuple[str, list[Any], list[Any]] | None = None
        async for message in socket:
            body = {k: v for k, v in orjson.loads(message.data).items() if k != "type"}
            if last is not None and body.get("previous_response_id") == last[0]:
                del body["previous_response_id"]
                body["input"] = [*last[1], *last[2], *input_items(body)]
            reply = await self._reply(body)
            if isinstance(reply, _Refusal):
                error = {"type": "invalid_request_error", **reply.error()}
                refusal = {"type": "error", "status": reply.status, "error": error}
                await socket.send_str(orjson.dumps(refusal).decode())
                continue
            for event in self._events(reply):
                await socket.send_str(orjson.dumps(event).decode())
            last = (reply["id"], input_items(body), reply["output"])
        return socket

    def _move(self, body: dict[str, Any], items: list[Any], number: int) -> Move:
        """The scripted agent's move when one is set; else a call of the first tool while
        ``tool_rounds`` last, then an answer."""
        if is_summary_request(body):
            return fake_summary(body)
        if self.agent is not None:
            tools = tool_names(body.get("tools"))
            text = text_of_request(items)
            return self.agent.move(text, last_user_text(items), tools, number)
        last = items[-1] if items else {}
        tools = body.get("tools") or []
        wants_tool = last.get("type", "message") == "function_call_output" or (
            last.get("type", "message") == "message" and last.get("role") == "user"
        )
        if (
            tools
            and wants_tool
            and self.calls_made < self.tool_rounds
            and isinstance(tools[0], dict)
        ):
            self.calls_made += 1
            name = str(tools[0].get("name", "tool"))
            arguments = orjson.dumps({"step": number}).decode()
            return ShellCall(call_id=f"call_fake{number}", name=name, arguments=arguments)
        return f"Done ({len(items)} items read)."

    async def _stream(self, request: web.Request, response: dict[str, Any]) -> web.StreamResponse:
        stream = web.StreamResponse(headers={**self.headers(), "Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for event in self._events(response):
            kind = event["type"]
            await stream.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")
            if self.cut_streams:
                self.cut_streams -= 1
                assert request.transport is not None
                request.transport.abort()  # the provider's end of the stream, cut short
                return stream
        await stream.write_eof()
        return stream

    def _events(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The events streaming ``response``, in order."""
        events: list[dict[str, Any]] = []

        def send(kind: str, **fields: Any) -> None:
            events.append({"type": kind, "sequence_number": len(events), **fields})

        started = {**response, "status": "in_progress", "output": [], "usage": None}
        send("response.created", response=started)
        send("response.in_progress", response=started)
        for index, item in enumerate(response["output"]):
            opened = {**item, "status": "in_progress"}
            send("response.output_item.added", output_index=index, item=opened)
            if item["type"] == "message":
                text = item["content"][0]["text"]
                part = {"type": "output_text", "text": "", "annotations": []}
                where = {"item_id": item["id"], "output_index": index, "content_index": 0}
                send("response.content_part.added", **where, part=part)
                size = max(1, len(text) // self.stream_pieces)
                for start in range(0, len(text), size):
                    piece = text[start : start + size]
                    send("response.output_text.delta", **where, delta=piece, logprobs=[])
                send("response.output_text.done", **where, text=text, logprobs=[])
                send("response.content_part.done", **where, part={**part, "text": text})
            else:
                where = {"item_id": item["id"], "output_index": index}
                arguments = item["arguments"]
                send("response.function_call_arguments.delta", **where, delta=arguments)
                send("response.function_call_arguments.done", **where, arguments=arguments)
            send("response.output_item.done", output_index=index, item=item)
        send("response.completed", response=response)
        return events


@frozen
class _Refusal:
    """A request the API refuses: its message, ``param`` and ``code``."""

    message: str
    param: str | None
    code: str | None
    status: int = 400

    def error(self) -> dict[str, Any]:
        return {"message": self.message, "param": self.param, "code": self.code}


def _not_kept(item_id: Any) -> str:
    return (
        f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to "
        "false. Try again with `store` set to true, or remove this item from your input."
    )


def _response(
    response_id: str, model: str, body: dict[str, Any], output: list[Any], usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }


def _error(
    status: int, message: str, param: str | None, code: str | None, headers: dict[str, str]
) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return web.Response(
        status=status,
        body=orjson.dumps({"error": error}),
        content_type="application/json",
        headers=headers,
    )
