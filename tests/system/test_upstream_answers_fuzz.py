"""Property-based: whatever the upstream answers, the client gets that answer, and the
conversation goes on.

The proxy reads what an upstream answers: usage (to anchor its meter and size the answer's
reserve), error bodies (to tell a context overflow or a spent quota), stream events. An
upstream is a program too, and a self-hosted one or a gateway in between can answer anything:
usage in strings or past 64 bits, an error with no message, a stream of stray lines. Hypothesis
draws such answers (status, content type, body, how it is cut into chunks, its coding) for chat,
Responses and Messages requests, streamed or not. Each must reach the client as the upstream
sent it (the proxy's 4xx in the caller's shape stands in for an upstream's 4xx only where it
says why), and the conversation's next request, answered normally, must be answered as such:
nothing the odd answer left behind may spoil it.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request
from tests.strategies import junk, texts
from tests.threaded_proxy import MODEL, send, serving

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 1_000
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

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
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

_conversations = itertools.count()
_OUTPUT = "line of output from the tool, long enough to weigh something\n" * 12


def history(wire: str, task: str) -> list[dict[str, Any]]:
    """A task and two tool calls with their outputs, in ``wire``'s shape."""
    if wire == "responses":
        turns: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for n in range(2):
            turns.append(
                {"type": "function_call", "call_id": f"c{n}", "name": "bash", "arguments": "{}"}
            )
            turns.append({"type": "function_call_output", "call_id": f"c{n}", "output": _OUTPUT})
        return turns
    if wire == "messages":
        turns = [{"role": "user", "content": task}]
        for n in range(2):
            call = {"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {}}
            result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": _OUTPUT}
            turns.append({"role": "assistant", "content": [call]})
            turns.append({"role": "user", "content": [result]})
        return turns
    turns = [{"role": "system", "content": "You are a coding agent."}]
    turns.append({"role": "user", "content": task})
    for n in range(2):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        turns.append({"role": "tool", "tool_call_id": f"c{n}", "content": _OUTPUT})
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


def headers_for(wire: str) -> list[tuple[str, bytes | str]]:
    sent: list[tuple[str, bytes | str]] = [("Content-Type", "application/json")]
    if wire == "messages":
        return [*sent, ("x-api-key", "sk-ant-fuzz"), ("anthropic-version", "2023-06-01")]
    return [*sent, ("Authorization", "Bearer sk-fuzz")]


class Running:
    """The proxy's port and the scripted upstream (a plain class: Hypothesis prints it)."""

    def __init__(self, port: int, upstream: ScriptedUpstream) -> None:
        self.port = port
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"Running(port={self.port})"


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    upstream = ScriptedUpstream()
    with serving(upstream.app()) as port:
        yield Running(port, upstream)


def _is_proxys_own_refusal(wire: str, status: int, answer: bytes) -> bool:
    """A 4xx the proxy wrote in the caller's error shape, saying why."""
    if not 400 <= status < 500:
        return False
    error = orjson.loads(answer)
    if wire == "messages":
        return error.get("type") == "error" and bool(error["error"]["message"])
    return bool(error["error"]["message"])


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(answer=answers(), wire=st.sampled_from(WIRES), stream=st.booleans())
def test_any_upstream_answer_reaches_the_client_and_the_next_request_is_served(
    running: Running, answer: Answer, wire: str, stream: bool
) -> None:
    n = next(_conversations)
    turns = history(wire, f"Fix issue {n} in the parser; the tests are in tests/.")
    running.upstream.answer = answer
    status, headers, got = send(
        running.port, PATHS[wire], request_body(wire, turns, stream), headers_for(wire)
    )
    relayed = (status, got) == (answer.status, answer.body)
    assert relayed or (400 <= answer.status < 500 and _is_proxys_own_refusal(wire, status, got)), (
        status,
        got[:300],
        headers,
    )
    if relayed and answer.content_type is not None:
        assert headers.get("content-type", "").startswith(answer.content_type)

    normal = normal_answer(wire)
    running.upstream.answer = normal
    status, _, got = send(
        running.port,
        PATHS[wire],
        request_body(wire, followed_up(wire, turns, n), False),
        headers_for(wire),
    )
    assert (status, got) == (200, normal.body), (status, got[:300])
