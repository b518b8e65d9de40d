"""Property-based: whatever a client sends, the proxy answers it, never with a 5xx of its own.

Hypothesis generates bodies (valid-looking and junk at every level the proxy reads), raw bytes,
deep nesting, odd headers and bad encodings, and sends them to a real proxy in front of the fake
upstream. A 4xx must be in OpenAI's error shape; a 5xx may only be the upstream's own answer
(it carries the upstream's request id); and the proxy still serves a normal request afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from compaction_proxy.parsing import jsonio
from compaction_proxy.security.client_keys import digest_of
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.encodings import ENCODINGS, compressed
from tests.strategies import items, junk, messages, texts, words
from tests.threaded_proxy import ADMIN_TOKEN, MODEL, WINDOW, send, serving

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

EXAMPLES = 2_200


class Servers:
    """The proxy's port and the fake upstream behind it. Not a dataclass: Hypothesis prints
    a dataclass field by field in an example's report, and what the fake received may be
    nested too deep to print."""

    def __init__(self, proxy_port: int, fake: FakeUpstream) -> None:
        self.proxy_port = proxy_port
        self.fake = fake

    def __repr__(self) -> str:
        return f"Servers(proxy_port={self.proxy_port})"


@contextmanager
def fuzz_servers(**extra: Any) -> Iterator[Servers]:
    """The fake upstream (its window for ``MODEL`` as small as the route's) and a proxy."""
    fake = FakeUpstream()
    fake.windows[MODEL] = WINDOW
    with serving(fake.app(), **extra) as port:
        yield Servers(port, fake)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with fuzz_servers() as running:
        yield running


FUZZ_CLIENT_KEY = "cpk-fuzz-0123456789"


@pytest.fixture(scope="module")
def keyed_servers() -> Iterator[Servers]:
    """A proxy holding the upstream key, in owned mode: every body is searched for the
    stored objects it names, and for decision fields given twice."""
    os.environ["FUZZ_UPSTREAM_KEY"] = "sk-held-fuzz"
    try:
        with fuzz_servers(
            upstream_api_key_env="FUZZ_UPSTREAM_KEY",
            account_endpoints="owned",
            client_key_digests=[digest_of(FUZZ_CLIENT_KEY)],
        ) as running:
            yield running
    finally:
        del os.environ["FUZZ_UPSTREAM_KEY"]


def assert_answered(status: int, headers: dict[str, str], body: bytes) -> None:
    if status >= 500:
        assert headers.get("x-request-id", "").startswith("req_fake"), (status, body[:300])
    if 400 <= status < 500 and "x-request-id" not in headers:
        assert headers.get("content-type", "").startswith("application/json"), (status, body)
        error = orjson.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]


# -- strategies ----------------------------------------------------------------------------

bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["fuzz-small", "fuzz-model"]) | junk,
        "messages": st.lists(messages, max_size=12) | junk,
    },
    optional={
        "stream": st.booleans() | junk,
        "tools": junk,
        "stream_options": junk,
        "max_tokens": st.integers(min_value=-5, max_value=10**30) | junk,
        "metadata": junk,
    },
)


def nested(depth: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    return b'{"model":"fuzz-small","messages":[{"role":"user","content":"x","x":' + inner + b"}]}"


raw_bodies = (
    bodies.map(jsonio.dumps)
    | st.binary(max_size=200)
    | st.integers(min_value=1, max_value=1_100).map(nested)
    | bodies.map(lambda b: jsonio.dumps(b)[:-1])
    | st.sampled_from(
        [
            b'{"model":"fuzz-small","messages":[{"role":"user","content":"\\ud800 lone"}]}',
            b'{"model":"fuzz-small","messages":[{"role":"user","content":"x"}],"n":1'
            + b"0" * 40
            + b"}",
        ]
    )
)
# Any bytes but control characters, which no HTTP client can send in a header (the server's
# HTTP parser answers those before the proxy sees a request).
header_values = st.binary(max_size=24).map(
    lambda raw: bytes(b for b in raw if b >= 0x20 and b != 0x7F)
) | texts(24).map(str.encode)
# Each header at most once: duplicated singleton headers are malformed HTTP, answered by the
# server's HTTP parser before any handler runs.
headers = st.dictionaries(
    st.sampled_from(["Authorization", "X-Session-Id", "api-key", "X-Custom", "User-Agent"]),
    header_values,
    max_size=3,
).map(lambda chosen: list(chosen.items()))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    body=raw_bodies,
    extra=headers,
    encoding=st.sampled_from(["plain", *ENCODINGS]),
    honest=st.booleans(),
)
def test_no_input_gets_a_5xx_from_the_proxy(
    servers: Servers, body: bytes, extra: list[tuple[str, Any]], encoding: str, honest: bool
) -> None:
    request_headers: list[tuple[str, bytes | str]] = [("Content-Type", "application/json")]
    request_headers += [
        (name, value)
        for name, value in extra
        if not any(b < 0x20 or b == 0x7F for b in _bytes(value))
    ]
    if encoding != "plain":
        request_headers.append(("Content-Encoding", encoding))
        if honest:  # else the body is not what the header says
            body = compressed(body, encoding)
    status, response_headers, answer = send(
        servers.proxy_port, "/v1/chat/completions", body, request_headers
    )
    assert_answered(status, response_headers, answer)


# Each endpoint after chat's: half the examples, the same terms.
per_endpoint = settings(
    max_examples=EXAMPLES // 2,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
responses_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["fuzz-small", "fuzz-model"]) | junk,
        "input": st.lists(items, max_size=10) | words | junk,
    },
    optional={
        "instructions": words | junk,
        "stream": st.booleans() | junk,
        "tools": junk,
        "previous_response_id": st.none() | texts(8) | junk,
        "max_output_tokens": st.integers(min_value=-5, max_value=10**30) | junk,
    },
)


@per_endpoint
@given(body=responses_bodies.map(jsonio.dumps) | st.binary(max_size=100))
# Found by a randomized run: an integer past 64 bits in a streamed request (the fake upstream
# cut its stream after the headers; it must answer 400 as a provider does).
@example(body=b'{"model":"fuzz-small","input":[],"stream":true,"tools":-9223372036854775809}')
def test_no_responses_input_gets_a_5xx_from_the_proxy(servers: Servers, body: bytes) -> None:
    headers: list[tuple[str, bytes | str]] = [("Content-Type", "application/json")]
    status, response_headers, answer = send(servers.proxy_port, "/v1/responses", body, headers)
    assert_answered(status, response_headers, answer)


blocks = (
    st.fixed_dictionaries({"type": st.just("text"), "text": words | junk})
    | st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": texts(6) | junk, "name": words, "input": junk}
    )
    | st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": texts(6) | junk},
        optional={"content": words | st.lists(junk, max_size=2) | junk, "is_error": junk},
    )
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["thinking", "image", "x"])},
        optional={"thinking": words, "signature": texts(8), "source": junk},
    )
    | junk
)
turns = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]) | junk,
        "content": words | st.lists(blocks, max_size=4) | junk,
    }
)
messages_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["fuzz-small", "claude-fuzz"]) | junk,
        "messages": st.lists(turns, max_size=10) | junk,
    },
    optional={
        "system": words | st.lists(blocks, max_size=2) | junk,
        "stream": st.booleans() | junk,
        "tools": junk,
        "max_tokens": st.integers(min_value=-5, max_value=10**30) | junk,
    },
)


@per_endpoint
@given(body=messages_bodies.map(jsonio.dumps) | st.binary(max_size=100))
def test_no_messages_input_gets_a_5xx_from_the_proxy(servers: Servers, body: bytes) -> None:
    """Anthropic-format clients: the proxy's 4xx in Anthropic's error shape, never a 5xx."""
    headers: list[tuple[str, bytes | str]] = [
        ("Content-Type", "application/json"),
        ("x-api-key", "sk-ant-fuzz"),
    ]
    status, _, answer = send(servers.proxy_port, "/v1/messages", body, headers)
    assert status < 500, (status, answer[:300])
    if status >= 400:
        error = orjson.loads(answer)
        assert error["type"] == "error", error
        assert isinstance(error["error"]["message"], str) and error["error"]["message"]


segments = st.sampled_from(
    ["embeddings", "models", "files", "responses", "batches", "x"]
) | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="?#%/"),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    path=st.lists(segments, min_size=1, max_size=4).map(lambda parts: "/v1/" + "/".join(parts)),
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
    body=bodies.map(jsonio.dumps) | st.binary(max_size=100),
    json_type=st.booleans(),
)
def test_no_pass_through_request_gets_a_5xx_from_the_proxy(
    servers: Servers, path: str, method: str, body: bytes, json_type: bool
) -> None:
    """Whatever the path, method or body, the answer is the upstream's (its own 404 or 405
    included) or the proxy's 4xx, never a 5xx of the proxy's own."""
    content_type = "application/json" if json_type else "application/octet-stream"
    status, headers, answer = send(
        servers.proxy_port, path, body, [("Content-Type", content_type)], method=method
    )
    assert status < 500 or headers.get("x-request-id", "").startswith("req_fake"), answer[:300]


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    path=st.sampled_from(
        ["/admin/conversations", "/admin/conversations/c0/log", "/admin/conversations/c0"]
    ),
    query=st.dictionaries(st.sampled_from(["limit", "after", "x"]), texts(10)),
)
def test_admin_parameters_get_a_4xx_not_a_5xx(
    servers: Servers, path: str, query: dict[str, str]
) -> None:
    from urllib.parse import urlencode

    token: list[tuple[str, bytes | str]] = [("Authorization", f"Bearer {ADMIN_TOKEN}")]
    url = f"{path}?{urlencode(query)}" if query else path
    status, _, answer = send(servers.proxy_port, url, b"", token, method="GET")
    assert status < 500, answer[:300]


def test_the_proxy_still_serves_after_the_fuzzing(servers: Servers) -> None:
    body = orjson.dumps({"model": "fuzz-small", "messages": [{"role": "user", "content": "hi"}]})
    status, _, answer = send(
        servers.proxy_port, "/v1/chat/completions", body, [("Authorization", "Bearer k")]
    )
    assert status == 200 and orjson.loads(answer)["choices"][0]["message"]["content"] == "ok"


# Fields that name stored objects, or are read for the decisions that bind them, with values
# of every kind; spelled plainly or with an escaped letter, and given more than once.
naming_keys = st.sampled_from(
    [
        "file_id",
        "file_ids",
        "previous_response_id",
        "conversation",
        "container",
        "vector_store_ids",
        "input_file_id",
        "training_file",
        "model",
        "stream",
    ]
)
naming_values = (
    st.none()
    | texts(8)
    | junk
    | st.lists(texts(8) | junk, max_size=3)
    | st.fixed_dictionaries({"id": texts(8) | junk})
)


def _key(name: str, escaped: bool) -> bytes:
    if escaped and "_" in name:
        return name.replace("_", "\\u005f").encode()
    return name.encode()


# Input items and skill entries that may name stored objects, their deciding fields given
# in any order, any number of times.
item_fields = st.lists(
    st.tuples(
        st.sampled_from(["type", "id", "encrypted_content", "skill_id", "summary"]),
        st.sampled_from(["item_reference", "reasoning", "custom", "skill_reference", "anthropic"])
        | naming_values,
    ),
    max_size=5,
)


def _object(fields: list[tuple[str, Any]], escaped: bool) -> bytes:
    return (
        b"{"
        + b",".join(b'"' + _key(k, escaped) + b'":' + jsonio.dumps(v) for k, v in fields)
        + b"}"
    )


@st.composite
def naming_bodies(draw: st.DrawFn) -> bytes:
    """A JSON object with a model, the fields above at the top and inside a content part, input
    items and skill entries."""
    escaped = draw(st.booleans())
    top = draw(st.lists(st.tuples(naming_keys, naming_values), max_size=4))
    inner = draw(st.lists(st.tuples(naming_keys, naming_values), max_size=3))
    part = _object([("type", "file"), *inner], escaped)
    items = [_object(fields, escaped) for fields in draw(st.lists(item_fields, max_size=3))]
    skills = (
        b"["
        + b",".join(_object(f, escaped) for f in draw(st.lists(item_fields, max_size=2)))
        + b"]"
    )
    content = b'[{"role":"user","content":[' + part + b"]}"
    fields = [b'"model":"fuzz-small"', b'"messages":' + content + b"]"]
    fields.append(b'"input":' + content + b"".join(b"," + item for item in items) + b"]")
    if draw(st.booleans()):
        fields.append(b'"container":{"skills":' + skills + b"}")
    else:
        fields.append(b'"tools":[{"type":"shell","environment":{"skills":' + skills + b"}}]")
    fields += [b'"' + _key(k, escaped) + b'":' + jsonio.dumps(v) for k, v in top]
    return b"{" + b",".join(fields) + b"}"


@settings(
    max_examples=EXAMPLES // 2,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    body=naming_bodies(),
    path=st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/responses/compact",
            "/v1/responses/input_tokens",
            "/v1/messages",
            "/v1/batches",
            "/v1/vector_stores",
        ]
    ),
)
def test_no_body_naming_objects_gets_a_5xx_from_a_proxy_holding_the_key(
    keyed_servers: Servers, body: bytes, path: str
) -> None:
    headers: list[tuple[str, bytes | str]] = [
        ("Content-Type", "application/json"),
        ("Authorization", f"Bearer {FUZZ_CLIENT_KEY}"),
    ]
    status, response_headers, answer = send(keyed_servers.proxy_port, path, body, headers)
    upstreams = response_headers.get("x-request-id", "").startswith("req_fake")
    assert status < 500 or upstreams, answer[:300]
