"""Property-based: what one tenant sends, and what the upstream answers it, changes nothing the
proxy does for another tenant.

Two proxies, alike, each in front of an upstream of its own. In every example tenant A's
request (any wire format, streamed or not, one of two keys, sometimes an argument named in an
overflow's words) goes to the first proxy alone and is answered with whatever an upstream may
answer; then tenant B starts a conversation in any format (a history drawn near the window,
so it may be compacted at once) on both. What reaches each upstream for B, summary calls
included, and what B is told, must be the same: nothing a proxy keeps of A (a learned window,
a calibration, a slot) may change B's requests. Background rounds are off, so both proxies
decide in step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

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
    headers_for,
    history,
    normal_answer,
    request_body,
)
from tests.strategies import texts

EXAMPLES = 300
# About 330 tokens a tool round: 4 to 14 rounds reach from a third of the 4,000-token window
# past it.
B_OUTPUT = "a longer line of output from the tool, which weighs in the history\n" * 22
_conversations = itertools.count()
# Words of context overflows that state a limit under the window, as an argument's name.
OVERFLOW_WORDS = ["maximum context length is 1000", "prompt is too long: 5000 tokens > 900 maximum"]


class Pair:
    """Two proxies alike, and their upstreams (a plain class: Hypothesis prints it)."""

    def __init__(self, ports: tuple[int, int], upstreams: tuple[ScriptedUpstream, ...]) -> None:
        self.ports = ports
        self.upstreams = upstreams

    def __repr__(self) -> str:
        return f"Pair(ports={self.ports})"


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    first, second = ScriptedUpstream(), ScriptedUpstream()
    synchronous = {"policy": {"precompact_ratio": 0}}
    with serving(first.app(), **synchronous) as one, serving(second.app(), **synchronous) as two:
        yield Pair((one, two), (first, second))


def with_argument(body: bytes, name: str) -> bytes:
    """``body`` with an argument the client made up."""
    return body[:-1] + b"," + orjson.dumps(name) + b":1}"


def refused_argument(name: str) -> Answer:
    """OpenAI's answer to an argument it does not know: it names it."""
    message = f"Unrecognized request argument supplied: {name}"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return Answer(400, "application/json", [orjson.dumps({"error": error})])


def counted_as(wire: str, tokens: int) -> Answer:
    """An ordinary answer whose usage counts the prompt at ``tokens``."""
    body = orjson.loads(normal_answer(wire).body)
    body["usage"]["prompt_tokens" if wire == "chat" else "input_tokens"] = tokens
    return Answer(200, "application/json", [orjson.dumps(body)])


@dataclass
class Traffic:
    """Tenant A's request and what its upstream answers."""

    wire: str
    stream: bool
    key: str
    body: bytes
    answer: Answer


@st.composite
def tenant_a_traffic(draw: st.DrawFn) -> Traffic:
    n = next(_conversations)
    wire = draw(st.sampled_from(WIRES))
    stream = draw(st.booleans())
    body = request_body(wire, history(wire, f"A's task {n}.", draw(st.integers(0, 6))), stream)
    argument = draw(st.none() | st.sampled_from(OVERFLOW_WORDS) | texts(20))
    if argument is not None:
        body, answer = with_argument(body, argument), refused_argument(argument)
    else:
        answer = draw(answers() | st.integers(1, 200_000).map(lambda n: counted_as(wire, n)))
    key = draw(st.sampled_from(["sk-tenant-a", "sk-tenant-a2"]))
    return Traffic(wire, stream, key, body, answer)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(a=tenant_a_traffic(), b_wire=st.sampled_from(WIRES), b_rounds=st.integers(4, 14))
def test_nothing_one_tenant_sends_or_is_answered_changes_anothers_requests(
    pair: Pair, a: Traffic, b_wire: str, b_rounds: int
) -> None:
    n = next(_conversations)
    first, second = pair.upstreams
    first.answer = a.answer
    send(pair.ports[0], PATHS[a.wire], a.body, headers_for(a.wire, a.key))

    b_turns = history(b_wire, f"B's task {n}.", b_rounds, B_OUTPUT)
    b_body = request_body(b_wire, b_turns, False)
    told = []
    for port, upstream in zip(pair.ports, pair.upstreams, strict=True):
        upstream.answer = normal_answer(b_wire)
        upstream.received.clear()
        status, headers, got = send(port, PATHS[b_wire], b_body, headers_for(b_wire, "sk-b"))
        told.append((status, headers.get("x-compaction-status"), got))
    assert told[0] == told[1]
    assert first.received == second.received
