"""The Redis servers tests write into: one shared by the tests that ask for it, and private
ones for tests that stop and restart Redis.

Tests never write into a server they did not start or were not given: the shared server is
``$REDIS_URL`` when the caller sets it, otherwise a redis-server started on a free port the
first time a test of this process asks for it (``shared_redis_url``), and stopped when the
process ends. A run that asks for no Redis starts none (the unit tier, ``-m "not slow"`` on a
machine without redis-server); each pytest-xdist worker starts its own.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

import pytest
import redis
import redis.asyncio as aioredis

from tests.processes import free_port

_GIVEN_URL = os.environ.get("REDIS_URL", "")  # read before any test clears the environment
_shared: list[str] = []  # the shared server's URL, once started or given


def shared_redis_url() -> str:
    """The URL of the Redis this process's tests share; starts it on first use."""
    if not _shared:
        _shared.append(_GIVEN_URL or _start_shared_server())
    return _shared[0]


def _start_shared_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed: install it, or set REDIS_URL")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    atexit.register(_stop, process)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                return url
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()


class RedisServer:
    """A redis-server of a test's or a bench's own; ``wrapper``: a command it runs under (a
    bench counts its instructions under valgrind), given ``start_seconds`` to come up."""

    def __init__(self, wrapper: Sequence[str] = (), start_seconds: float = 5.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (.ci/run installs it)")
        self.binary = binary
        self.wrapper = tuple(wrapper)
        self.start_seconds = start_seconds
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.wrapper,
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL if self.wrapper else None,
        )
        client = aioredis.Redis.from_url(self.url)
        try:
            for _ in range(int(self.start_seconds / 0.05)):
                try:
                    await client.ping()
                    return
                except Exception:
                    await asyncio.sleep(0.05)
            raise TimeoutError("redis-server did not start")
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self.process = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
