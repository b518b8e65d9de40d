"""A supervisor takes a worker for started when it says so, whatever it printed before."""

from __future__ import annotations

import asyncio

import pytest

from compaction_proxy.ops.workers import READY_LINE, said_ready


def reader(*chunks: bytes) -> asyncio.StreamReader:
    stream = asyncio.StreamReader()
    for chunk in chunks:
        stream.feed_data(chunk)
    stream.feed_eof()
    return stream


async def test_lines_before_thesaid_ready_are_passed_on_not_taken_for_a_failure(
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    assert await said_ready(reader(b"a library's notice\n", READY_LINE, b"later\n"))
    assert b"a library's notice" in capfdbinary.readouterr().out


async def test_a_worker_that_exits_without_thesaid_ready_did_not_start() -> None:
    assert not await said_ready(reader(b"Traceback (most recent call last):\n"))
    assert not await said_ready(reader())
