"""Every crash found by attacking the proxy on purpose, each pinned by a test: bad input gets a
4xx in OpenAI's shape, a fault of the proxy's own forwards the client's bytes unchanged."""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory
from tests.encodings import ENCODINGS, compressed
from tests.helpers import counter

MODEL = "any-model"


def body_with(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": [message]})


def nested(depth: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    part = b'{"type":"image_url","image_url":{"url":"data:,"},"meta":' + inner + b"}"
    return b'{"model":"any-model","messages":[{"role":"user","content":[' + part + b"]}]}"


async def post(url: str, raw: bytes, **headers: str) -> tuple[int, dict[str, Any], Any]:
    async with aiohttp.ClientSession() as http_session:
        async with http_session.post(
            f"{url}/chat/completions",
            data=raw,
            headers={"Content-Type": "application/json", **headers},
            compress=False,
        ) as response:
            payload = await response.read()
            parsed = orjson.loads(payload) if payload.startswith(b"{") else payload
            return response.status, dict(response.headers), parsed


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (body_with({"role": ["user"], "content": "x"}), "messages[0].role"),
        (body_with({"role": {}, "content": "x"}), "messages[0].role"),
        (body_with({"role": "assistant", "tool_calls": 1}), "messages[0].tool_calls"),
        (body_with({"role": "assistant", "tool_calls": True}), "messages[0].tool_calls"),
        (body_with({"role": "assistant", "tool_calls": 1.5}), "messages[0].tool_calls"),
        (body_with({"role": "assistant", "tool_calls": [1]}), "messages[0].tool_calls[0]"),
        (body_with({"role": "user", "content": {"text": "x"}}), "messages[0].content"),
        (body_with({"role": "user", "content": [{"type": "text"}]}), "messages[0].content[0].text"),
        (body_with({"role": "user", "content": [7]}), "messages[0].content[0]"),
        (
            body_with({"role": "tool", "content": "x", "tool_call_id": 5}),
            "messages[0].tool_call_id",
        ),
        (body_with({"role": "user", "content": "x", "name": ["a"]}), "messages[0].name"),
        (orjson.dumps({"model": 5, "messages": []}), "model"),
        (orjson.dumps({"model": MODEL, "messages": [], "stream": "yes"}), "stream"),
        (nested(1_100), None),  # deeper than any JSON parser here accepts
    ],
)
async def test_malformed_bodies_get_a_400_naming_the_field(
    make_proxy: ProxyFactory, fake: FakeUpstream, raw: bytes, param: str | None
) -> None:
    proxy = await make_proxy()
    status, _, answer = await post(proxy.url, raw)
    assert status == 400
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["param"] == param
    assert fake.received == []


async def test_nesting_deeper_than_the_serializer_allows_is_still_forwarded(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    proxy = await make_proxy()
    raw = nested(300)  # orjson parses 1024 levels but serializes only 254
    status, headers, _ = await post(proxy.url, raw)
    assert status == 200
    assert fake.received[-1].body == orjson.loads(raw)
    assert headers["X-Compaction-Status"] in ("none", "bypass")


def _post_raw_header(url: str, name: str, value: bytes) -> tuple[int, Any]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    body = body_with({"role": "user", "content": "hi"})
    connection.putrequest("POST", f"{parts.path}/chat/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader(name, value)
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    answer = orjson.loads(response.read())
    connection.close()
    return response.status, answer


async def test_an_authorization_header_that_is_not_utf8_gets_a_400(proxy_url: str) -> None:
    # http.client sends the raw bytes (aiohttp's client would refuse to); off the loop, since
    # the proxy runs on it.
    status, answer = await asyncio.to_thread(
        _post_raw_header, proxy_url, "Authorization", b"Bearer \xff\xfe"
    )
    assert status == 400
    assert answer["error"]["param"] == "Authorization"


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_body_that_is_not_the_encoding_it_claims_gets_a_400_and_no_error_logged(
    proxy_url: str, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    status, _, answer = await post(
        proxy_url, b"not compressed at all", **{"Content-Encoding": encoding}
    )
    assert status == 400
    assert answer["error"]["param"] == "Content-Encoding"
    assert answer["error"]["code"] == "invalid_body_encoding"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _post_after_the_headers(url: str, body: bytes, encoding: str) -> tuple[int, Any]:
    """The body sent once the headers have gone, as a client streaming it does."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest("POST", f"{parts.path}/chat/completions")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Encoding", encoding)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders()
        time.sleep(0.1)
        connection.send(body)
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        connection.close()


# The spin blocks the event loop the test runs on, so no asyncio timeout fires: the signal
# pytest-timeout sends does.
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "path", ["/chat/completions", "/responses", "/messages", "/files", "/embeddings"]
)
async def test_empty_bodies_one_after_another_are_each_answered(proxy_url: str, path: str) -> None:
    """aiohttp hands every request without a body one shared empty reader, which ends once
    and then reports the end of a chunk for good: read by chunks, a second empty request
    spun the event loop, and no client was answered again."""
    async with aiohttp.ClientSession() as http_session:
        for _ in range(3):
            async with asyncio.timeout(5):
                async with http_session.post(
                    f"{proxy_url}{path}",
                    data=b"",
                    headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
                ) as response:
                    await response.read()
                    assert response.status < 500


def _post_chunked(url: str, chunks: list[bytes], broken: bytes = b"") -> tuple[int, Any]:
    """``chunks`` sent with ``Transfer-Encoding: chunked`` (no ``Content-Length``) once the
    headers have gone, as a client streaming its body does; with ``broken``, that framing
    follows the chunks a moment later instead of the chunked body's end."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest("POST", f"{parts.path}/chat/completions")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        time.sleep(0.1)
        connection.send(b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks))
        if broken:
            time.sleep(0.1)
        connection.send(broken or b"0\r\n\r\n")
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        connection.close()


def _in_pieces(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


LIMIT = 64 << 10


def _body_of_size(size: int) -> bytes:
    """A chat body of exactly ``size`` bytes."""
    shell = body_with({"role": "user", "content": ""})
    return body_with({"role": "user", "content": "x" * (size - len(shell))})


@pytest.mark.parametrize("piece", [1000, 7, LIMIT])
async def test_a_chunked_body_is_read_whole_up_to_the_limit_and_refused_past_it(
    make_proxy: ProxyFactory, fake: FakeUpstream, piece: int
) -> None:
    """A body with no ``Content-Length`` is counted as it arrives: one at the limit reaches
    the upstream byte for byte, however it was cut; one byte more is a 413."""
    proxy = await make_proxy(max_body_bytes=LIMIT)
    at_limit = _body_of_size(LIMIT)
    status, _ = await asyncio.to_thread(_post_chunked, proxy.url, _in_pieces(at_limit, piece))
    assert status == 200 and fake.received[-1].body == orjson.loads(at_limit)
    past = _body_of_size(LIMIT + 1)
    status, answer = await asyncio.to_thread(_post_chunked, proxy.url, _in_pieces(past, piece))
    assert status == 413 and answer["error"]["code"] == "request_too_large"


async def test_a_chunked_body_whose_framing_breaks_midway_is_given_up_not_held(
    make_proxy: ProxyFactory,
) -> None:
    """The framing breaks while the body is being read. aiohttp's parser queues its error
    behind the request and never ends the body, which held its handler as long as the
    client kept the connection: it is given up as a stalled body is, 408 in the client's API
    shape."""
    proxy = await make_proxy(upload_idle_timeout_seconds=0.5)
    raw = body_with({"role": "user", "content": "hi " * 300})
    half = len(raw) // 2
    status, answer = await asyncio.to_thread(
        _post_chunked, proxy.url, [raw[:half]], b"zz\r\n" + raw[half:]
    )
    assert status == 408 and answer["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_truncated_body_sent_after_its_headers_is_answered_400(
    proxy_url: str, encoding: str
) -> None:
    """aiohttp's own decoding checked a deflate body's end inside its HTTP parser, where no
    handler could answer: the client waited for an answer that never came."""
    packed = compressed(body_with({"role": "user", "content": "hi " * 500}), encoding)
    status, answer = await asyncio.to_thread(
        _post_after_the_headers, proxy_url, packed[: len(packed) // 2], encoding
    )
    assert status == 400 and answer["error"]["code"] == "invalid_body_encoding"


async def test_a_coding_the_proxy_cannot_undo_gets_a_415(proxy_url: str) -> None:
    raw = body_with({"role": "user", "content": "hi"})
    status, _, answer = await post(proxy_url, raw, **{"Content-Encoding": "compress"})
    assert status == 415
    assert answer["error"]["code"] == "unsupported_content_encoding"


async def test_a_small_body_that_decodes_past_the_limit_gets_a_413(
    make_proxy: ProxyFactory,
) -> None:
    proxy = await make_proxy(max_body_bytes=1 << 20)
    bomb = compressed(b" " * (8 << 20), "zstd")  # 8 MiB of JSON whitespace in a few KiB
    status, headers, answer = await post(proxy.url, bomb, **{"Content-Encoding": "zstd"})
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    assert headers["Connection"] == "close"


# Codex sends its requests zstd-compressed; aiohttp's clients and curl can send br.
@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_compressed_body_reaches_the_upstream_readable(
    proxy_url: str, fake: FakeUpstream, encoding: str
) -> None:
    raw = body_with({"role": "user", "content": "hi"})
    packed = compressed(raw, encoding)
    status, _, answer = await post(proxy_url, packed, **{"Content-Encoding": encoding})
    assert status == 200 and answer["choices"][0]["message"]["content"] == "ok"
    received = fake.received[-1]
    assert received.body == orjson.loads(raw)
    assert "Content-Encoding" not in received.headers


@pytest.mark.parametrize(
    "query",
    ["limit=abc", "limit=0", "limit=-3", "limit=99999", "after=abc", "after=1-2-3", "after=%00"],
)
async def test_admin_parameters_are_validated(make_proxy: ProxyFactory, query: str) -> None:
    token = "an-admin-token-0123456789"
    proxy = await make_proxy(admin_token=token)
    path = "/admin/conversations/c0/log" if query.startswith("after") else "/admin/conversations"
    async with aiohttp.ClientSession() as http_session:
        async with http_session.get(
            f"{proxy.root}{path}?{query}", headers={"Authorization": f"Bearer {token}"}
        ) as response:
            assert response.status == 400
            assert (await response.json())["reason"]


def bypasses(cause: str) -> float:
    labels = {"route": "*", "cause": cause}
    return counter("compaction_proxy_bypassed_requests_total", **labels)


async def test_a_fault_in_the_proxy_forwards_the_clients_bytes_unchanged(
    make_proxy: ProxyFactory,
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import compaction_proxy.service.prepare

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the proxy")

    monkeypatch.setattr(compaction_proxy.service.prepare.RequestView, "of", broken)
    proxy_ = await make_proxy()
    before = bypasses("error")
    raw = b'{"model": "any-model",   "messages": [{"role": "user", "content": "hi"}]}'
    with caplog.at_level(logging.ERROR):
        status, headers, answer = await post(proxy_.url, raw)
    assert status == 200 and answer["choices"][0]["message"]["content"] == "ok"
    assert headers["X-Compaction-Status"] == "bypass"
    assert fake.received[-1].body == orjson.loads(raw)
    assert bypasses("error") == before + 1
    faults = [r for r in caplog.records if "forwarding it unchanged" in r.getMessage()]
    assert len(faults) == 1 and faults[0].exc_info is not None
