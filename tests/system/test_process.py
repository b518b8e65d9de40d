"""The proxy as a process: the console entry point, and graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy import __version__
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import user
from tests.processes import alive, children_of, free_port, proxy_process
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai


async def test_sigterm_drains_in_flight_requests(fake: FakeUpstream, upstream_url: str) -> None:
    fake.response_delay = 1.0
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
    }
    async with proxy_process(env) as (process, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
            in_flight = asyncio.create_task(
                client.chat.completions.create(model="fake-model", messages=[user("hello")])
            )
            while not fake.received:
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            reply = await in_flight
            assert reply.choices[0].message.content == "ok"
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_metrics_on_their_own_port(upstream_url: str) -> None:
    import aiohttp

    from tests.processes import free_port

    port = free_port()
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "COMPACTION_PROXY_METRICS_PORT": str(port),
    }
    async with proxy_process(env) as (_, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
            await client.chat.completions.create(model="fake-model", messages=[user("hi")])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
    assert 'compaction_proxy_requests_total{outcome="ok",route="*"} 1.0' in text


async def test_metrics_combine_worker_processes(upstream_url: str, tmp_path: Any) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, any worker's /metrics reports all workers together."""
    import aiohttp

    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    async with proxy_process(env) as (_, first), proxy_process(env) as (_, second):
        for base in (first, second, second):
            async with openai.AsyncOpenAI(
                base_url=f"{base}/v1", api_key="k", max_retries=0
            ) as client:
                await client.chat.completions.create(model="fake-model", messages=[user("hi")])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{first}/metrics") as response:
                text = await response.text()
    assert 'compaction_proxy_requests_total{outcome="ok",route="*"} 3.0' in text


async def run_serve(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``python -m compaction_proxy serve`` that is expected to exit: its status and its
    standard error."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "compaction_proxy",
        "serve",
        *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_a_port_in_use_is_one_clear_line_not_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, stderr = await run_serve("--port", str(port))
    assert status == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in stderr
    assert "Traceback" not in stderr


async def test_a_malformed_redis_url_is_refused_before_listening() -> None:
    status, stderr = await run_serve(
        "--port", str(free_port()), env={"REDIS_URL": "redis://:hunter2@localhost:abc/0"}
    )
    assert status == 2
    assert "store_url" in stderr and "port is not a number" in stderr
    assert "environment variable REDIS_URL" in stderr
    assert "hunter2" not in stderr and "Traceback" not in stderr


async def test_start_up_logs_one_line_naming_what_it_serves(
    upstream_url: str, private_redis: RedisServer
) -> None:
    password_url = private_redis.url.replace("redis://", "redis://default:hunter2@", 1)
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "COMPACTION_PROXY_STORE_URL": password_url,
        "COMPACTION_PROXY_COLOUR": "blue",
        "COMPACTION_PROXY_ROUTES": orjson.dumps(
            [{"model": "long-*", "base_url": upstream_url, "context_window": 64000}]
        ).decode(),
    }
    async with proxy_process(env, capture_stderr=True) as (process, _):
        process.terminate()
        await process.wait()
        assert process.stderr is not None
        logged = (await process.stderr.read()).decode()
    line = next(ln for ln in logged.splitlines() if f"compaction-proxy {__version__} on" in ln)
    assert f"upstream {upstream_url}" in line and "workers 1" in line
    assert f"routes long-* -> {upstream_url} (64000 tokens)" in line
    shown = private_redis.url.replace("redis://", "redis://default:***@", 1)
    assert "admin API off" in line and f"store {shown}" in line and "hunter2" not in logged
    assert "COMPACTION_PROXY_COLOUR names no setting" in logged


@asynccontextmanager
async def two_workers(
    upstream_url: str, redis: RedisServer, *args: str, capture_stderr: bool = False
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, set[int]]]:
    """``serve --workers 2`` on Redis; the supervisor, the base URL and both workers' pids."""
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
        "REDIS_URL": redis.url,
    }
    async with proxy_process(env, "--workers", "2", *args, capture_stderr=capture_stderr) as (
        supervisor,
        base,
    ):
        deadline = asyncio.get_running_loop().time() + 60  # a worker waits 60 s to listen
        while len(workers := children_of(supervisor.pid)) < 2:  # the second may be starting
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail(f"one worker of two after 60 s: {sorted(workers)}")
            await asyncio.sleep(0.1)
        yield supervisor, base, workers


async def test_each_request_is_an_access_line_a_socket_frame_named_by_its_client(
    upstream_url: str,
) -> None:
    """The served proxy logs aiohttp's access line for each request; a WebSocket frame's
    request, which reaches the proxy over loopback, names the client that sent the frame."""
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "s",
    }
    async with proxy_process(env, capture_stderr=True) as (process, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
            await client.chat.completions.create(model="m", messages=[user("Hi.")])
        create = orjson.dumps({"type": "response.create", "model": "m", "input": "Hi."})
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            ) as session,
            session.ws_connect(base.replace("http://", "ws://") + "/v1/responses") as socket,
        ):
            await socket.send_str(create.decode())
            ended = ("response.completed", "response.incomplete", "response.failed", "error")
            while orjson.loads((await socket.receive(timeout=20)).data)["type"] not in ended:
                pass
        process.terminate()
        await process.wait()
        assert process.stderr is not None
        logged = (await process.stderr.read()).decode()
    lines = [
        line.split("aiohttp.access: ", 1)[1]
        for line in logged.splitlines()
        if "aiohttp.access: " in line
    ]
    assert any(
        line.startswith("127.0.0.1 [") and '"POST /v1/chat/completions HTTP/1.1" 200' in line
        for line in lines
    ), lines
    assert any(
        line.startswith("127.0.0.2 [") and '"POST /v1/responses HTTP/1.1" 200' in line
        for line in lines
    ), lines


async def test_workers_share_the_port_reload_without_dropping_a_request_and_stop_together(
    upstream_url: str, private_redis: RedisServer
) -> None:
    async with two_workers(upstream_url, private_redis) as (supervisor, base, first):
        assert len(first) == 2
        stop = asyncio.Event()

        async def keep_asking() -> int:
            answered = 0
            # The SDK's own retries, as clients run: an idle keep-alive connection an old
            # worker closes as it drains can race a request sent on it, which never reached
            # the server and is retried on a new connection.
            async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k") as c:
                while not stop.is_set():
                    reply = await c.chat.completions.create(
                        model="fake-model", messages=[user(f"hi {answered}")]
                    )
                    assert reply.choices[0].message.content == "ok"
                    answered += 1
            return answered

        asking = asyncio.create_task(keep_asking())
        await asyncio.sleep(0.5)
        supervisor.send_signal(signal.SIGHUP)
        # The new workers listening, the old ones gone: an old worker may drain for up to the
        # shutdown timeout (30 s) while this client keeps its connection busy.
        for _ in range(450):
            if not children_of(supervisor.pid) & first and len(children_of(supervisor.pid)) == 2:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the workers were not replaced")
        await asyncio.sleep(0.5)
        stop.set()
        answered = await asking  # not one request failed across the reload
        assert answered > 10
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/metrics") as response:
                text = await response.text()
        # One worker's /metrics counts every worker's requests, the replaced ones included.
        counted = next(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith('compaction_proxy_requests_total{outcome="ok"')
        )
        assert counted == answered
        workers = children_of(supervisor.pid)
        supervisor.terminate()
        assert await asyncio.wait_for(supervisor.wait(), 30) == 0
    assert not any(alive(pid) for pid in workers)


async def test_several_workers_refuse_the_in_process_store() -> None:
    status, stderr = await run_serve("--port", str(free_port()), "--workers", "2")
    assert status == 2
    assert "workers 2 needs a store the workers share" in stderr and "Redis" in stderr


async def test_workers_stop_by_themselves_when_their_supervisor_is_killed(
    upstream_url: str, private_redis: RedisServer
) -> None:
    async with two_workers(upstream_url, private_redis) as (supervisor, _, workers):
        supervisor.kill()
        await supervisor.wait()
        for _ in range(100):
            if not any(alive(pid) for pid in workers):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("orphaned workers kept the port")


async def test_a_reload_with_a_broken_configuration_keeps_the_running_workers(
    upstream_url: str, private_redis: RedisServer, tmp_path: Path
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("log_level: INFO\n")
    async with two_workers(
        upstream_url, private_redis, "--config", str(config), capture_stderr=True
    ) as (supervisor, base, workers):
        assert supervisor.stderr is not None
        logged = b""
        while b"2 workers listening" not in logged:  # both have read the configuration
            logged += await asyncio.wait_for(supervisor.stderr.readline(), 30)
        config.write_text("log_level: [unclosed\n")
        supervisor.send_signal(signal.SIGHUP)
        while b"reload failed" not in logged:  # the new worker failed on the configuration
            logged += await asyncio.wait_for(supervisor.stderr.readline(), 30)
        # ...and is gone, however loaded the host: the running workers alone stay.
        for _ in range(100):
            if children_of(supervisor.pid) == workers:
                break
            await asyncio.sleep(0.1)
        assert children_of(supervisor.pid) == workers
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as c:
            reply = await c.chat.completions.create(model="fake-model", messages=[user("hi")])
        assert reply.choices[0].message.content == "ok"
        supervisor.terminate()
        assert await asyncio.wait_for(supervisor.wait(), 30) == 0
        logged += await supervisor.stderr.read()
    assert b"invalid YAML" in logged and b"reload failed" in logged
    # The variables the supervisor sets for its workers are no operator's typo.
    assert b"names no setting" not in logged
