"""Usage, from an SSE stream however its bytes are split, or from a whole answer; and what the
provider's prompt cache did with the prompt it counts."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web

from compaction_proxy.formats.usage import (
    PromptCacheUse,
    chat_usage,
    prompt_cache_use,
    usage_of_body,
)
from compaction_proxy.http.upstream import UsageScanner
from compaction_proxy.service.exchange import Reply, usage_of

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

STREAM = (
    b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(STREAM)])
def test_usage_chunk_found_at_any_split(size: int) -> None:
    scanner = UsageScanner()
    for i in range(0, len(STREAM), size):
        scanner.feed(STREAM[i : i + size])
    scanner.close()
    assert scanner.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def test_stream_without_usage_leaves_none() -> None:
    scanner = UsageScanner()
    scanner.feed(b'data: {"choices":[],"usage":null}\n\ndata: [DONE]\n\n')
    scanner.close()
    assert scanner.usage is None


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        (b'{"usage": {"prompt_tokens": 5}}', {"prompt_tokens": 5}),
        (b"not json", None),
        (b"[]", None),
        (b'{"usage": null}', None),
    ],
)
def test_usage_of_body(body: bytes, usage: dict[str, int] | None) -> None:
    assert usage_of_body(body) == usage


USAGE = {"prompt_tokens": 5, "completion_tokens": 2}


@pytest.mark.parametrize(
    ("reply", "usage"),
    [
        (Reply(web.Response(), 200, answer=orjson.dumps({"usage": USAGE})), USAGE),
        (Reply(web.Response(), 200, answer=b"<html>not json</html>"), None),
        (Reply(web.Response(), 200, usage=USAGE), USAGE),  # a stream's, as relayed
        (Reply(web.Response(), 0), None),  # nothing answered
    ],
)
async def test_usage_of_a_reply_is_read_from_its_answer_or_its_stream(
    reply: Reply[web.Response], usage: dict[str, int] | None
) -> None:
    assert await usage_of(reply) == usage


usages = st.none() | st.fixed_dictionaries(
    {"prompt_tokens": st.integers(0, 10**6), "completion_tokens": st.integers(0, 10**6)}
)
events = st.tuples(st.text(max_size=40), usages)


@settings(max_examples=300, deadline=None)
@given(
    stream=st.lists(events, max_size=8),
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=4_000), max_size=12),
    extra_lines=st.booleans(),
)
def test_the_last_usage_is_found_whatever_the_line_endings_and_cuts(
    stream: list[tuple[str, dict[str, int] | None]],
    ending: bytes,
    cuts: list[int],
    extra_lines: bool,
) -> None:
    """SSE allows LF, CRLF and CR; an upstream's bytes arrive cut anywhere."""
    raw = b""
    for text, usage in stream:
        if extra_lines:
            raw += b"event: chunk" + ending + b": a comment" + ending
        event = {"choices": [{"delta": {"content": text}}], "usage": usage}
        raw += b"data: " + orjson.dumps(event) + ending + ending
    raw += b"data: [DONE]" + ending + ending
    scanner = UsageScanner()
    start = 0
    for cut in sorted({min(c, len(raw)) for c in cuts}):
        scanner.feed(raw[start:cut])
        start = cut
    scanner.feed(raw[start:])
    scanner.close()
    expected = next((u for _, u in reversed(stream) if u is not None), None)
    assert scanner.usage == expected


def test_a_line_past_the_bound_is_dropped_and_the_next_one_read() -> None:
    scanner = UsageScanner()
    scanner.MAX_LINE_BYTES = 1_000
    scanner.feed(b'data: {"usage": {"prompt_tokens": 1}, "pad": "')
    for _ in range(10):
        scanner.feed(b"x" * 200)  # the line outgrows the bound: not kept
    scanner.feed(b'"}\ndata: {"usage": {"prompt_tokens": 2}}\n')
    assert scanner.usage == {"prompt_tokens": 2}


@pytest.mark.parametrize(
    ("stream", "finished"),
    [
        (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', False),
        (b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n', True),
        (b"data: [DONE]\n\n", True),
        (
            b'event: response.completed\ndata: {"type": "response.completed", "response": {}}\n',
            True,
        ),
        (
            b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta"}\n',
            False,
        ),
        (b'event: message_stop\ndata: {"type": "message_stop"}\n\n', True),
        (b'event: message_delta\ndata: {"type": "message_delta", "usage": {}}\n\n', False),
    ],
)
def test_an_answer_is_whole_once_its_terminal_event_went_by(stream: bytes, finished: bool) -> None:
    scanner = UsageScanner()
    scanner.feed(stream)
    assert scanner.finished is finished


def _event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **fields}) + b"\n\n"


RESPONSE = {"id": "resp_1", "output": [], "usage": None}
DONE = {"id": "resp_1", "output": [{"id": "rs_1"}, {"id": "msg_1"}], "usage": {"input_tokens": 1}}


@pytest.mark.parametrize(
    ("events", "taken"),
    [
        # The response at its first event, its output items at its last.
        (
            [
                _event("response.created", response=RESPONSE),
                _event("response.completed", response=DONE),
            ],
            [["resp_1"], ["rs_1", "msg_1"]],
        ),
        # A first event that names nothing: the last names the response and its items.
        (
            [
                _event("response.in_progress", response=RESPONSE),
                _event("response.completed", response=DONE),
            ],
            [[], ["resp_1", "rs_1", "msg_1"]],
        ),
    ],
)
def test_what_a_stream_creates_is_taken_once_as_its_events_go_by(
    events: list[bytes], taken: list[list[str]]
) -> None:
    scanner = UsageScanner(wants_created=True)
    seen = []
    for event in events:
        scanner.feed(event)
        seen.append(scanner.take_created())
    assert seen == taken
    assert scanner.take_created() == []


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # Chat: cached tokens within the prompt; from GPT-5.6 the tokens written too.
        (
            {"prompt_tokens": 1_000, "prompt_tokens_details": {"cached_tokens": 700}},
            PromptCacheUse(read=700, written=0, uncached=300),
        ),
        (
            {
                "prompt_tokens": 1_000,
                "prompt_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 380},
            },
            PromptCacheUse(read=600, written=380, uncached=20),
        ),
        # Responses, read as chat's terms.
        (
            chat_usage(
                {
                    "input_tokens": 900,
                    "output_tokens": 5,
                    "input_tokens_details": {"cached_tokens": 512, "cache_write_tokens": 388},
                }
            ),
            PromptCacheUse(read=512, written=388, uncached=0),
        ),
        # Anthropic: reads and writes beside input_tokens, which holds the rest.
        (
            chat_usage(
                {
                    "input_tokens": 40,
                    "cache_creation_input_tokens": 300,
                    "cache_read_input_tokens": 9_000,
                    "output_tokens": 12,
                }
            ),
            PromptCacheUse(read=9_000, written=300, uncached=40),
        ),
        # A provider that says nothing of its cache: all of it uncached.
        ({"prompt_tokens": 50, "completion_tokens": 2}, PromptCacheUse(0, 0, 50)),
        # Counts that are no counts, or more than the prompt: never a negative rest.
        (
            {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 250}},
            PromptCacheUse(read=100, written=0, uncached=0),
        ),
        (
            {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": True}},
            PromptCacheUse(read=0, written=0, uncached=100),
        ),
        (
            {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": -5}},
            PromptCacheUse(read=0, written=0, uncached=100),
        ),
        ({"prompt_tokens": 0}, None),
        ({"prompt_tokens": "12"}, None),
        ({"completion_tokens": 3}, None),
    ],
)
def test_a_prompt_splits_into_what_the_providers_cache_read_wrote_and_left(
    usage: dict[str, object], expected: PromptCacheUse | None
) -> None:
    assert prompt_cache_use(usage) == expected


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "prompt_tokens",
                "input_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
                "prompt_tokens_details",
                "input_tokens_details",
            ]
        ),
        st.one_of(
            st.integers(-(2**70), 2**70),
            st.none(),
            st.booleans(),
            st.text(max_size=3),
            st.dictionaries(
                st.sampled_from(["cached_tokens", "cache_write_tokens"]),
                st.one_of(st.integers(-(2**70), 2**70), st.none(), st.text(max_size=3)),
            ),
        ),
    )
)
def test_any_usage_splits_into_parts_that_add_up_to_its_prompt(usage: dict[str, object]) -> None:
    use = prompt_cache_use(usage)
    if use is not None:
        assert min(use.read, use.written, use.uncached) >= 0
        assert use.read + use.written + use.uncached == usage["prompt_tokens"]
