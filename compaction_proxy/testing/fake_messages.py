"""The fake provider's Anthropic Messages API: ``POST /v1/messages`` (whole or streamed),
``/v1/messages/count_tokens`` and message batches, answering as Anthropic does and refusing, in
its words, what it refuses: a first turn not the user's, a ``tool_use`` without its
``tool_result`` in the next turn, an orphan ``tool_result``, more than 4 ``cache_control``
breakpoints, an edited or missing signed thinking block where the API checks one, a prompt over
the window. With thinking enabled it thinks first and signs what it thought. A summary request
(the proxy's instruction last) is answered with a summary keeping every ``FACT-n`` line.

It asks for a key the way the API does (``x-api-key``, or a bearer token for OAuth) and keeps
every request's headers and body, so tests can see what reached it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.frozen import frozen
from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request, text_of
from compaction_proxy.testing.prompt_cache import CacheRead, PromptCaches, messages_prompt

UNLIMITED = 10_000_000
# A scripted model: the content blocks of its answer to a request
Script = Callable[[dict[str, Any]], list[dict[str, Any]]]


def anthropic_error(status: int, kind: str, message: str) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def anthropic_models(models: list[str]) -> dict[str, Any]:
    """``GET /v1/models`` as Anthropic answers it."""
    data = [
        {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
        for m in models
    ]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"data": data, "has_more": False, "first_id": first, "last_id": last}


def _blocks(turn: Any) -> list[Any]:
    content = turn.get("content") if isinstance(turn, dict) else None
    return content if isinstance(content, list) else []


def refusal(body: dict[str, Any]) -> str | None:
    """What the Messages API would refuse in ``body``, in its words; None when nothing."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        return "messages: at least one message is required"
    if not isinstance(turns[0], dict) or turns[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    breakpoints = sum(
        1
        for turn in turns
        for block in _blocks(turn)
        if isinstance(block, dict) and block.get("cache_control")
    )
    system = body.get("system")
    if isinstance(system, list):
        breakpoints += sum(1 for b in system if isinstance(b, dict) and b.get("cache_control"))
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    for index, turn in enumerate(turns):
        previous = turns[index - 1] if index else {}
        calls = [
            b.get("id")
            for b in _blocks(previous)
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        answered = [
            b.get("tool_use_id")
            for b in _blocks(turn)
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if not all(isinstance(c, str) for c in (*answered, *calls)):
            return f"messages.{index}: `tool_use_id` and `id`: Input should be a valid string"
        called = set(calls)
        orphans = [call for call in answered if call not in called]
        if orphans:
            return (
                f"messages.{index}.content: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {orphans[0]}. Each `tool_result` block must have a corresponding "
                "`tool_use` block in the previous message."
            )
        missing = sorted(str(c) for c in called if c not in answered) if previous else []
        if missing:
            return (
                f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
    last = turns[-1]
    if isinstance(last, dict) and last.get("role") == "assistant":
        unanswered = [
            b for b in _blocks(last) if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        if unanswered:
            return (
                f"messages.{len(turns) - 1}: `tool_use` ids were found without `tool_result` "
                "blocks immediately after."
            )
    return None


def sign(thinking: str) -> str:
    """The signature the fake gives a thinking block: what an edited block no longer has."""
    return "sig-" + hashlib.blake2b(thinking.encode(), digest_size=12).hexdigest()


def thinking_refusal(body: dict[str, Any]) -> str | None:
    """With thinking enabled, the API checks the assistant turn of the tool round in progress
    (the last one, answered by the last user turn's ``tool_result`` blocks): it must start with
    its thinking, every thinking block as signed. Older turns' thinking may be left out."""
    thinking = body.get("thinking")
    turns = body.get("messages")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    last = _blocks(turns[-1])
    results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
    index = len(turns) - 2
    final = turns[index]
    if not results or not isinstance(final, dict) or final.get("role") != "assistant":
        return None
    blocks = [b for b in _blocks(final) if isinstance(b, dict)]
    first = blocks[0].get("type") if blocks else None
    if first not in ("thinking", "redacted_thinking"):
        return (
            f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{first}`. When `thinking` is enabled, a final `assistant` message must "
            "start with a thinking block (preceeding the lastmost set of `tool_use` and "
            "`tool_result` blocks)."
        )
    for position, block in enumerate(blocks):
        signed = sign(str(block.get("thinking")))
        if block.get("type") == "thinking" and block.get("signature") != signed:
            return f"messages.{index}.content.{position}: Invalid `signature` in `thinking` block"
    return None


@frozen
class MessagesRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeMessages:
    """State of the Messages endpoints; ``routes()`` serves them."""

    count_text: Callable[[str], int] = lambda text: len(text) // 4 + 1
    window_of: Callable[[str], int] = lambda model: UNLIMITED
    received: list[MessagesRequest] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    overflows: list[int] = field(default_factory=list)  # prompts refused as over the window
    reply_text: str = "Done."
    # Set by a test: the blocks of each answer (a scripted agent's moves), from the request
    script: Script | None = None
    # Set by a test: streams break off after their first block with this error event
    stream_error: dict[str, Any] | None = None
    # Set by a test: a streamed answer (not a summary call's) pauses after its start until
    # this is set, as a model still writing a long answer
    hold_streams: asyncio.Event | None = None
    # Set by a test: this many summary calls that leave the tools usable are answered with a
    # tool call alone, as a model offered tools may answer
    summary_tool_calls: int = 0
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    touched: list[Any] = field(default_factory=list)  # request ids cache touches named
    # An Anthropic-compatible endpoint without the context-management beta (most of them)
    # refuses the field, as a strict schema does.
    knows_context_management: bool = False
    prompt_caches: PromptCaches = field(default_factory=PromptCaches)  # breakpoint caching
    cache_reads: list[CacheRead] = field(default_factory=list)  # each answered prompt's
    # Off for benchmarks, as the chat fake's: prompts sized by their bytes, nothing cached,
    # no body kept, so the upstream answers as fast as it can and holds no growing list.
    count_tokens: bool = True
    keep_requests: bool = True
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self._create),
            web.post("/v1/messages/count_tokens", self._count_tokens),
            web.post("/v1/messages/cache_touch", self._cache_touch),
            web.post("/v1/messages/batches", self._create_batch),
            web.get("/v1/messages/batches", self._list_batches),
            web.get("/v1/messages/batches/{batch}", self._batch),
            web.get("/v1/messages/batches/{batch}/results", self._batch_results),
        ]

    async def _create_batch(self, request: web.Request) -> web.Response:
        body = await self._read(request, needs_model=False)
        if isinstance(body, web.Response):
            return body
        batch_id = f"msgbatch_{len(self.batches):024d}"
        requests = body.get("requests")
        self.batches[batch_id] = {
            "id": batch_id,
            "type": "message_batch",
            "processing_status": "ended",
            "request_counts": {
                "processing": 0,
                "succeeded": len(requests) if isinstance(requests, list) else 0,
                "errored": 0,
                "canceled": 0,
                "expired": 0,
            },
            "created_at": "2025-01-01T00:00:00Z",
            "expires_at": "2025-01-02T00:00:00Z",
            "ended_at": "2025-01-01T00:00:01Z",
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": f"{request.url.origin()}/v1/messages/batches/{batch_id}/results",
        }
        return web.json_response(self.batches[batch_id])

    async def _list_batches(self, request: web.Request) -> web.Response:
        data = list(self.batches.values())
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return web.json_response(
            {"data": data, "has_more": False, "first_id": first, "last_id": last}
        )

    async def _batch(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["batch"])
        if batch is None:
            return anthropic_error(404, "not_found_error", "Not found")
        return web.json_response(batch)

    async def _batch_results(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch"]
        if batch_id not in self.batches:
            return anthropic_error(404, "not_found_error", "Not found")
        line = {"custom_id": "0", "result": {"type": "succeeded", "message": {"id": batch_id}}}
        return web.Response(body=orjson.dumps(line) + b"\n", content_type="application/binary")

    @property
    def summary_requests(self) -> list[MessagesRequest]:
        return [r for r in self.received if is_summary_request(r.body)]

    async def _read(
        self, request: web.Request, needs_model: bool = True
    ) -> dict[str, Any] | web.Response:
        if not (request.headers.get("x-api-key") or request.headers.get("Authorization")):
            return anthropic_error(401, "authentication_error", "x-api-key header is required")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return anthropic_error(400, "invalid_request_error", "Invalid JSON in request body")
        if not isinstance(body, dict) or (needs_model and not isinstance(body.get("model"), str)):
            return anthropic_error(400, "invalid_request_error", "model: Field required")
        if self.keep_requests:
            self.received.append(MessagesRequest(request.path, dict(request.headers), body))
        return body

    def input_tokens(self, body: dict[str, Any]) -> int:
        total = 3
        system = body.get("system")
        if system is not None:
            total += self.count_text(system if isinstance(system, str) else text_of(system))
        for turn in body.get("messages") or []:
            total += 3
            content = turn.get("content") if isinstance(turn, dict) else None
            if isinstance(content, str):
                total += self.count_text(content)
                continue
            for block in content if isinstance(content, list) else []:
                total += self.block_tokens(block)
        if body.get("tools"):
            total += self.count_text(text_of(body["tools"]))
        return total

    def block_tokens(self, block: Any) -> int:
        """One content block's tokens as ``input_tokens`` counts them: its text, not its JSON."""
        if not isinstance(block, dict):
            return 0
        kind = block.get("type")
        if kind == "text":
            return self.count_text(str(block.get("text", "")))
        if kind == "tool_use":
            return (
                3
                + self.count_text(str(block.get("name")))
                + self.count_text(text_of(block.get("input", {})))
            )
        if kind == "tool_result":
            content = block.get("content")
            return 3 + self.count_text(content if isinstance(content, str) else text_of(content))
        if kind == "thinking":
            return self.count_text(str(block.get("thinking", "")))
        return self.count_text(text_of(block))

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        if "context_management" in body and not self.knows_context_management:
            problem = "context_management: Extra inputs are not permitted"
            return anthropic_error(400, "invalid_request_error", problem)
        return web.json_response({"input_tokens": self.input_tokens(body)})

    async def _cache_touch(self, request: web.Request) -> web.Response:
        """Claude Code's keepalive of a request's prompt cache: it reads the status alone."""
        body = await self._read(request, needs_model=False)
        if isinstance(body, web.Response):
            return body
        self.touched.append(body.get("request_id"))
        return web.json_response({})

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        problem = refusal(body) or thinking_refusal(body)
        if "context_management" in body and not self.knows_context_management:
            problem = "context_management: Extra inputs are not permitted"
        if problem is not None:
            self.refused.append(problem)
            return anthropic_error(400, "invalid_request_error", problem)
        tokens = self.input_tokens(body) if self.count_tokens else len(orjson.dumps(body)) // 4
        window = self.window_of(body["model"])
        cap = body.get("max_tokens")
        cap = cap if isinstance(cap, int) else 0
        if tokens + cap > window:
            self.overflows.append(tokens)
        if tokens > window:
            message = f"prompt is too long: {tokens} tokens > {window} maximum"
            return anthropic_error(400, "invalid_request_error", message)
        if tokens + cap > window:
            message = (
                f"input length and `max_tokens` exceed context limit: {tokens} + {cap} > "
                f"{window}, decrease input length or `max_tokens` and try again"
            )
            return anthropic_error(400, "invalid_request_error", message)
        content: list[dict[str, Any]]
        tools_usable = body.get("tools") and body.get("tool_choice") != {"type": "none"}
        if is_summary_request(body) and tools_usable and self.summary_tool_calls > 0:
            self.summary_tool_calls -= 1
            content = [{"type": "tool_use", "id": "toolu_summary", "name": "bash", "input": {}}]
        elif is_summary_request(body):
            content = [{"type": "text", "text": fake_summary(body)}]
        elif self.script is not None:
            content = self.script(body)
        else:
            content = [{"type": "text", "text": self.reply_text}]
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            thought = f"Thinking over turn {len(self.received)}."
            signed = {"type": "thinking", "thinking": thought, "signature": sign(thought)}
            content = [signed, *content]
        calls = any(block.get("type") == "tool_use" for block in content)
        number = len(self.received) if self.keep_requests else next(self._ids)
        read = written = 0
        if self.count_tokens:
            use = self.prompt_caches.anthropic(
                messages_prompt(body, self.count_text, self.block_tokens)
            )
            read = min(use.read, tokens)
            written = min(use.written, tokens - read)
            self.cache_reads.append(CacheRead(is_summary_request(body), tokens, read))
        message_body = {
            "id": f"msg_fake{number}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": tokens - read - written,  # Anthropic's: what the cache did not
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
                "output_tokens": 3,
            },
        }
        if not body.get("stream"):
            return web.json_response(message_body)
        hold = None if is_summary_request(body) else self.hold_streams
        return await self._stream(request, message_body, hold)

    async def _stream(
        self, request: web.Request, message: dict[str, Any], hold: asyncio.Event | None = None
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        started = {**message, "content": [], "stop_reason": None}
        started["usage"] = {**message["usage"], "output_tokens": 1}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": started}),
            ("ping", {"type": "ping"}),
        ]
        for index, block in enumerate(message["content"]):
            events += _block_events(index, block)
            if self.stream_error is not None:  # as Anthropic sends it mid-stream: then nothing
                events.append(("error", {"type": "error", "error": self.stream_error}))
                break
        else:
            events += self._ending(message)
        for name, data in events:
            event = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            await response.write(event)
            if name == "ping" and hold is not None:
                await hold.wait()
        await response.write_eof()
        return response

    @staticmethod
    def _ending(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        final = dict(message["usage"])  # cumulative, the prompt's counts included
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        return [
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": final}),
            ("message_stop", {"type": "message_stop"}),
        ]


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A content block as Anthropic streams it: opened empty, filled by deltas, closed."""
    deltas: list[dict[str, Any]]
    if block.get("type") == "tool_use":
        opened = {**block, "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [{"type": "input_json_delta", "partial_json": arguments}]
    elif block.get("type") == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    else:
        opened = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block.get("text", "")}]
    started = {"type": "content_block_start", "index": index, "content_block": opened}
    return [
        ("content_block_start", started),
        *(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def shell_agent(files: list[str], tool: str = "Bash") -> Script:
    """A scripted coding agent's model: it prints one of ``files`` with the shell tool each
    turn, then answers, naming every ``FACT-n`` line it saw in them. It reads how far it got
    from the tool results in the request, so a compacted history still tells it."""

    def move(body: dict[str, Any]) -> list[dict[str, Any]]:
        turns = body.get("messages") or []
        done = sum(
            1
            for turn in turns
            for block in _blocks(turn)
            if isinstance(block, dict) and block.get("type") == "tool_result"
        )
        summaries = str(turns).count("<compacted-summary>")
        done = max(done, summaries and len(files))  # a summary stands for what it replaced
        step = done if done < len(files) else None
        if step is None:
            return [{"type": "text", "text": f"Read all {len(files)} files."}]
        command = {"command": f"cat {files[step]}", "description": f"Print data file {step}"}
        call = {"type": "tool_use", "id": f"toolu_fake{step:03d}", "name": tool, "input": command}
        return [{"type": "text", "text": f"Reading file {step}."}, call]

    return move
