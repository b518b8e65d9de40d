"""A private redis-server process for tests that stop and restart Redis."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import redis.asyncio as aioredis

from tests.processes import free_port


class RedisServer:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (.ci/run installs it)")
        self.binary = binary
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
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
        )
        client = aioredis.Redis.from_url(self.url)
        try:
            for _ in range(100):
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
