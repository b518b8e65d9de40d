"""An upstream whose next answer a test sets, and what an upstream may answer, drawn by
Hypothesis: status, content type, JSON with usage in strings or past 64 bits, error bodies with
overflow wording and junk, SSE streams with cut JSON and stray lines, chunk splits, gzip. Also
a small agent conversation in each wire format, as a client would send it."""

from __future__ import annotations

import gzip
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request
from tests.threaded_proxy import MODEL

pytest.importorskip("hypothesis")  # a module of tests that uses these skips without it

from hypothesis import strategies as st

from tests.strategies import junk, texts

WIRES = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@dataclass
class Answer:
    """What the upstream answers next: ``chunks`` written one by one (chunked framing) or
    as one body with its length, ``coding`` applied to the whole."""

    status: int
    content_type: str | None
    chunks: list[bytes]
    chunked: bool = False
    gzipped: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class ScriptedUpstream:
    """An upstream that answers every request with ``answer``, and a summary call, when
    ``summaries`` is set, with a checkpoint (so a conversation can be compacted)."""

    def __init__(self) -> None:
        self.answer: Answer | None = None
        self.summaries = True
        # Every request received: its path, the key it carried and its body, as sent.
        self.received: list[tuple[str, str, bytes]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        key = request.headers.get("Authorization", "") or request.headers.get("x-api-key", "")
        self.received.append((request.path, key, raw))
        answer = self.answer
        if answer is None:
            return web.Response(status=404)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if self.summaries and isinstance(body, dict) and is_summary_request(body):
            answer = normal_answer(wire_of(request.path), fake_summary(body))
        headers = {"x-request-id": "req_scripted", **answer.headers}
        if answer.content_type is not None:
            headers["Content-Type"] = answer.content_type
        if answer.gzipped:
            headers["Content-Encoding"] = "gzip"
            chunks = [gzip.compress(answer.body)]
        else:
            chunks = answer.chunks
        if not answer.chunked:
            response = web.Response(status=answer.status, body=b"".join(chunks), headers=headers)
            if answer.content_type is None:
                response.headers.popall("Content-Type", None)
            return response
        stream = web.StreamResponse(status=answer.status, headers=headers)
        await stream.prepare(request)
        for chunk in chunks:
            await stream.write(chunk)
        await stream.write_eof()
        return stream


def wire_of(path: str) -> str:
    return next(wire for wire, known in PATHS.items() if path.endswith(known.removeprefix("/v1")))


def normal_answer(wire: str, text: str = "ok") -> Answer:
    """An ordinary answer in ``wire``'s shape, with ordinary usage."""
    if wire == "chat":
        body: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 300, "completion_tokens": 5, "total_tokens": 305},
        }
    elif wire == "responses":
        body = {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": MODEL,
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
            "usage": {"input_tokens": 300, "output_tokens": 5, "total_tokens": 305},
        }
    else:
        body = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 300, "output_tokens": 5},
        }
    return Answer(200, "application/json", [orjson.dumps(body)])


# -- what an upstream may answer ---------------------------------------------------------------

# Token counts of every kind, past 64 bits and below zero included.
counts = st.integers() | junk
usage_keys = [
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
]
usages = st.fixed_dictionaries({}, optional=dict.fromkeys(usage_keys, counts)) | junk
answer_objects = st.fixed_dictionaries(
    {"usage": usages},
    optional={
        "type": st.sampled_from(["message", "message_start", "response.completed"]) | junk,
        "id": texts(8) | junk,
        "choices": junk,
        "output": junk,
        "content": junk,
        "response": st.fixed_dictionaries({"usage": usages}) | junk,
        "message": st.fixed_dictionaries({"usage": usages}) | junk,
    },
)
limits = st.integers(min_value=-5, max_value=10**20)
overflow_words = st.builds(
    lambda window, tokens, wording: wording.format(window=window, tokens=tokens),
    limits,
    limits,
    st.sampled_from(
        [
            "This model's maximum context length is {window} tokens. However, your messages "
            "resulted in {tokens} tokens. Please reduce the length of the messages.",
            "prompt is too long: {tokens} tokens > {window} maximum",
            "input length and `max_tokens` exceed context limit: {tokens} + 1000 > {window}",
            "Your input exceeds the context window of this model.",
        ]
    ),
)
error_objects = st.fixed_dictionaries(
    {
        "error": st.fixed_dictionaries(
            {},
            optional={
                "message": overflow_words | texts(40) | junk,
                "type": st.sampled_from(
                    ["invalid_request_error", "rate_limit_error", "insufficient_quota", "x" * 70]
                )
                | junk,
                "code": st.sampled_from(["context_length_exceeded", "rate_limit_exceeded"]) | junk,
                "param": junk,
            },
        )
        | junk
    },
    optional={"type": st.just("error") | junk},
)


def _json(value: Any) -> bytes:
    # The standard library's encoder: integers past 64 bits are what is being tried.
    return json.dumps(value, ensure_ascii=False).encode()


def _event(name: str | None, data: bytes, newline: bytes) -> bytes:
    head = b"event: " + name.encode() + newline if name is not None else b""
    return head + b"data: " + data + newline + newline


json_bodies = answer_objects.map(_json) | error_objects.map(_json) | junk.map(_json)
# JSON cut short: a line that names usage and does not parse.
cut_json = (
    answer_objects.map(_json)
    .flatmap(lambda whole: st.tuples(st.just(whole), st.integers(1, len(whole) - 1)))
    .map(lambda cut: cut[0][: cut[1]])
)
sse_events = st.builds(
    _event,
    st.none() | st.sampled_from(["message_start", "message_delta", "response.completed", "x"]),
    cut_json | json_bodies | st.just(b"[DONE]") | texts(30).map(str.encode),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
)
header_values = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24
) | st.sampled_from(["5", "-1", "1e309", "Wed, 21 Oct 2015 07:28:00 GMT", "99999999999999999999"])
# A body of each kind, mostly under the content type it would come with.
kinds = st.sampled_from(["json", "sse", "sse", "bytes"])  # streams hold the most to read
CONTENT_TYPES = [None, "application/json", "text/event-stream", "text/plain", "text/html"]
USUAL_TYPE = {"json": "application/json", "sse": "text/event-stream", "bytes": "text/plain"}


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    kind = draw(kinds)
    if kind == "json":
        body = draw(json_bodies | cut_json)
    elif kind == "sse":
        body = b"".join(draw(st.lists(sse_events, max_size=6)))
    else:
        body = draw(st.binary(max_size=120))
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    chunks = [body[a:b] for a, b in itertools.pairwise([0, *cuts, len(body)])]
    usual = draw(st.booleans())
    return Answer(
        status=draw(st.sampled_from([200, 201, 400, 401, 404, 413, 422, 429, 500, 529]))
        if draw(st.booleans())
        else 200,
        content_type=USUAL_TYPE[kind] if usual else draw(st.sampled_from(CONTENT_TYPES)),
        chunks=[chunk for chunk in chunks if chunk],
        chunked=draw(st.booleans()),
        gzipped=draw(st.booleans()),
        headers=draw(st.dictionaries(st.sampled_from(["Retry-After", "X-Custom"]), header_values)),
    )


# -- the conversations -------------------------------------------------------------------------

_OUTPUT = "line of output from the tool, long enough to weigh something\n" * 12


def history(wire: str, task: str, rounds: int = 2, output: str = _OUTPUT) -> list[dict[str, Any]]:
    """A task and ``rounds`` tool calls with their outputs, in ``wire``'s shape."""
    if wire == "responses":
        turns: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for n in range(rounds):
            turns.append(
                {"type": "function_call", "call_id": f"c{n}", "name": "bash", "arguments": "{}"}
            )
            turns.append({"type": "function_call_output", "call_id": f"c{n}", "output": output})
        return turns
    if wire == "messages":
        turns = [{"role": "user", "content": task}]
        for n in range(rounds):
            call = {"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {}}
            result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": output}
            turns.append({"role": "assistant", "content": [call]})
            turns.append({"role": "user", "content": [result]})
        return turns
    turns = [{"role": "system", "content": "You are a coding agent."}]
    turns.append({"role": "user", "content": task})
    for n in range(rounds):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        turns.append({"role": "tool", "tool_call_id": f"c{n}", "content": output})
    return turns


def followed_up(wire: str, turns: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    if wire == "responses":
        reply = {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]}
        return [*turns, {"type": "message", **reply}, {"role": "user", "content": f"and {n}?"}]
    return [*turns, {"role": "assistant", "content": "done"}, {"role": "user", "content": f"{n}?"}]


def request_body(wire: str, turns: list[dict[str, Any]], stream: bool) -> bytes:
    key = "input" if wire == "responses" else "messages"
    body: dict[str, Any] = {"model": MODEL, key: turns, "stream": stream}
    if wire == "messages":
        body["max_tokens"] = 256
    return orjson.dumps(body)


def headers_for(wire: str, key: str = "sk-fuzz") -> list[tuple[str, bytes | str]]:
    """A client's headers in ``wire``'s form, with ``key`` as its credential."""
    sent: list[tuple[str, bytes | str]] = [("Content-Type", "application/json")]
    if wire == "messages":
        return [*sent, ("x-api-key", key), ("anthropic-version", "2023-06-01")]
    return [*sent, ("Authorization", f"Bearer {key}")]
