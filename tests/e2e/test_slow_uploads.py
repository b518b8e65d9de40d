"""Uploads that trickle never starve anyone: they have a connection pool of their own, a body
that stalls or crawls is given up with 408, one client and one address hold only so many at
once, and all uploads together leave part of the relay pool to everyone else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import counter

pytest.importorskip("openai")

import openai

BOUNDARY = "b0undary"
CHAT_PATH = "/v1/chat/completions"
CHAT_BODY = orjson.dumps(
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi " * 100}]}
)
MESSAGES_BODY = orjson.dumps(
    {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi " * 100}],
    }
)


@contextlib.asynccontextmanager
async def trickle(
    proxy: RunningProxy,
    key: str,
    pause: float,
    stop_after: int | None = None,
    source: str = "127.0.0.1",
) -> AsyncIterator[asyncio.Task[bytes]]:
    """A multipart upload to ``/v1/files`` from ``source`` sending a byte every ``pause``
    seconds (none more after ``stop_after``); yields the task reading the proxy's answer."""
    body = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n{'x' * 400}\r\n--{BOUNDARY}--\r\n"
    ).encode()
    multipart = f"multipart/form-data; boundary={BOUNDARY}"
    async with trickled(proxy, "/v1/files", key, multipart, body, pause, stop_after, source) as a:
        yield a


@contextlib.asynccontextmanager
async def trickled(
    proxy: RunningProxy,
    path: str,
    key: str,
    content_type: str,
    body: bytes,
    pause: float,
    stop_after: int | None = None,
    source: str = "127.0.0.1",
) -> AsyncIterator[asyncio.Task[bytes]]:
    """``body`` posted to ``path`` a byte every ``pause`` seconds (none more after
    ``stop_after``); yields the task reading the proxy's answer."""
    host, port = proxy.root.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
    )
    await writer.drain()

    async def send() -> None:
        for n, byte in enumerate(body):
            if stop_after is not None and n >= stop_after:
                await asyncio.sleep(3600)
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(pause)

    async def answer_of() -> bytes:
        # The head and the body it announces: the proxy answers before the upload's end,
        # and may keep reading what is left of it for a while before it closes.
        head = await reader.readuntil(b"\r\n\r\n")
        lengths = [
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ]
        if not lengths:  # a relayed answer, chunked: its head says enough
            return head
        return head + await reader.readexactly(lengths[0])

    sending = asyncio.create_task(send())
    answer = asyncio.create_task(answer_of())
    try:
        yield answer
    finally:
        sending.cancel()
        answer.cancel()
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ")[1])


async def chat(proxy: RunningProxy) -> float:
    started = time.perf_counter()
    async with openai.AsyncOpenAI(
        base_url=proxy.url, api_key="sk-other", max_retries=0, timeout=8
    ) as client:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    return time.perf_counter() - started


async def test_trickling_uploads_never_take_the_connections_chat_needs(
    make_proxy: ProxyFactory,
) -> None:
    proxy = await make_proxy(upstream_pool_size=2, relay_pool_size=2)
    async with trickle(proxy, "sk-a", 0.2), trickle(proxy, "sk-b", 0.2):
        await asyncio.sleep(0.5)  # both uploads hold an upstream connection by now
        assert await chat(proxy) < 2.0
        assert await chat(proxy) < 2.0


async def test_an_upload_that_stalls_is_given_up_with_a_408(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(upload_idle_timeout_seconds=0.5)
    async with trickle(proxy, "sk-a", 0.01, stop_after=30) as answer:
        reply = await asyncio.wait_for(answer, 5)
    assert status_of(reply) == 408
    body = orjson.loads(reply.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "request_timeout"


async def test_a_client_holds_at_most_its_uploads_at_once(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(max_uploads_per_client=2)
    async with (
        trickle(proxy, "sk-a", 0.2),
        trickle(proxy, "sk-a", 0.2),
        trickle(proxy, "sk-a", 0.2) as third,
        trickle(proxy, "sk-b", 0.2) as another_clients,
    ):
        reply = await asyncio.wait_for(third, 5)
        assert status_of(reply) == 429
        assert b"too_many_uploads" in reply
        await asyncio.sleep(0.3)
        assert not another_clients.done()  # its upload goes on


@pytest.mark.parametrize("sent", ["an upload", "a chat body"])
async def test_a_body_under_the_minimum_rate_is_given_up_with_a_408_past_its_grace(
    make_proxy: ProxyFactory, sent: str
) -> None:
    """A byte every 0.1 s never trips the idle timeout; the minimum rate stops it, for an
    upload relayed as it comes and a body the proxy reads whole alike."""
    proxy = await make_proxy(
        upload_idle_timeout_seconds=30,
        upload_grace_seconds=0.5,
        upload_min_bytes_per_second=1000,
    )
    started = time.perf_counter()
    sending = (
        trickle(proxy, "sk-a", 0.1)
        if sent == "an upload"
        else trickled(proxy, CHAT_PATH, "sk-a", "application/json", CHAT_BODY, 0.1)
    )
    async with sending as answer:
        reply = await asyncio.wait_for(answer, 10)
    assert status_of(reply) == 408
    assert 0.9 <= time.perf_counter() - started < 5
    body = orjson.loads(reply.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "request_timeout"
    assert "under 1000 bytes a second" in body["error"]["message"]


async def test_an_upload_at_a_fair_rate_goes_through_past_its_grace(
    make_proxy: ProxyFactory,
) -> None:
    proxy = await make_proxy(upload_grace_seconds=0.3, upload_min_bytes_per_second=50)
    async with trickle(proxy, "sk-a", 0.002) as answer:  # about 500 bytes a second
        reply = await asyncio.wait_for(answer, 10)
    assert status_of(reply) == 200


async def test_invented_keys_from_one_address_hold_only_its_bound_and_others_are_served(
    make_proxy: ProxyFactory,
) -> None:
    """A key per upload makes a new client each time, but not a new address: past the
    address's bound, 429; a client at another address still uploads and lists its files."""
    proxy = await make_proxy(relay_pool_size=8, max_uploads_per_address=3)
    async with contextlib.AsyncExitStack() as stack:
        answers = [
            await stack.enter_async_context(trickle(proxy, f"sk-invented-{n}", 0.2))
            for n in range(8)
        ]
        await asyncio.sleep(0.5)
        refused = [a for a in answers if a.done()]
        assert len(refused) == 5
        for answer in refused:
            assert status_of(answer.result()) == 429 and b"source address" in answer.result()
        async with trickle(proxy, "sk-victim", 0.0005, source="127.0.0.2") as upload:
            assert status_of(await asyncio.wait_for(upload, 8)) == 200
        started = time.perf_counter()
        async with openai.AsyncOpenAI(
            base_url=proxy.url, api_key="sk-victim", max_retries=0, timeout=8
        ) as victim:
            assert (await victim.files.list()).data
        assert time.perf_counter() - started < 2


async def test_uploads_leave_part_of_the_relay_pool_and_past_it_get_a_503_saying_so(
    make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Three quarters of an 8-connection pool: six uploads, from six addresses; the seventh
    gets 503 with Retry-After (the proxy's own pool is full, not the upstream), and a file
    list still has a connection."""
    caplog.set_level(logging.WARNING)
    proxy = await make_proxy(relay_pool_size=8)
    async with contextlib.AsyncExitStack() as stack:
        for n in range(6):
            await stack.enter_async_context(
                trickle(proxy, f"sk-{n}", 0.2, source=f"127.0.1.{n + 1}")
            )
        await asyncio.sleep(0.5)
        async with trickle(proxy, "sk-late", 0.2, source="127.0.2.1") as late:
            reply = await asyncio.wait_for(late, 5)
        assert status_of(reply) == 503
        assert b"Retry-After: 5" in reply and b"upload_slots_full" in reply
        async with openai.AsyncOpenAI(
            base_url=proxy.url, api_key="sk-other", max_retries=0, timeout=8
        ) as other:
            await other.files.list()
    said = [r.getMessage() for r in caplog.records]
    assert any("upload slots of the relay pool" in line for line in said)
    assert not any("upstream" in line and "timed out" in line for line in said)


@pytest.mark.parametrize(
    ("path", "body", "error_code"),
    [
        (CHAT_PATH, CHAT_BODY, "request_timeout"),
        ("/v1/messages", MESSAGES_BODY, None),
    ],
)
async def test_a_body_the_proxy_reads_whole_is_given_up_with_a_408_when_it_stalls(
    make_proxy: ProxyFactory, path: str, body: bytes, error_code: str | None
) -> None:
    """A chat or Messages body that stops coming held its handler for good; it is given up
    as an upload is, in the caller's API's error shape, and counted as the client's
    timeout."""
    proxy = await make_proxy(upload_idle_timeout_seconds=0.5)
    timeouts = counter("compaction_proxy_requests_total", route="", outcome="client_timeout")
    async with trickled(proxy, path, "sk-a", "application/json", body, 0.01, 30) as answer:
        reply = await asyncio.wait_for(answer, 5)
    assert status_of(reply) == 408
    error = orjson.loads(reply.partition(b"\r\n\r\n")[2])
    if error_code is not None:  # OpenAI's shape
        assert error["error"]["code"] == error_code
    else:  # Anthropic's
        assert error["type"] == "error" and "stalled" in error["error"]["message"]
    assert (
        counter("compaction_proxy_requests_total", route="", outcome="client_timeout")
        == timeouts + 1
    )
