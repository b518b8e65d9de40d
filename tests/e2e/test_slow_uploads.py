"""Uploads that trickle never starve anyone: they have a connection pool of their own, a body
that stalls is given up with 408, and one client holds only so many at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import openai
import orjson

from tests.conftest import ProxyFactory, RunningProxy

BOUNDARY = "b0undary"


@contextlib.asynccontextmanager
async def trickle(
    proxy: RunningProxy, key: str, pause: float, stop_after: int | None = None
) -> AsyncIterator[asyncio.Task[bytes]]:
    """A multipart upload to ``/v1/files`` sending a byte every ``pause`` seconds (none more
    after ``stop_after``); yields the task reading the proxy's answer."""
    host, port = proxy.root.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n{'x' * 400}\r\n--{BOUNDARY}--\r\n"
    ).encode()
    writer.write(
        (
            f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
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
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await reader.readexactly(length)

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
