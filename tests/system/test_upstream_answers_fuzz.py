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

import itertools
from collections.abc import Iterator

import orjson
import pytest

from tests.threaded_proxy import send, serving

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.scripted_upstream import (
    PATHS,
    WIRES,
    Answer,
    ScriptedUpstream,
    answers,
    followed_up,
    headers_for,
    history,
    normal_answer,
    request_body,
)

EXAMPLES = 1_000
_conversations = itertools.count()


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
