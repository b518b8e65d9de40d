"""Running the proxy as a real process, the way operators do."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_argv(port: int, module: str = "compaction_proxy", python: str | None = None) -> list[str]:
    """``python -m <module> serve --port <port>``, as this interpreter (or ``python``) runs it."""
    return [python or sys.executable, "-m", module, "serve", "--port", str(port)]


async def wait_until_ready(url: str, timeout: float = 30.0) -> None:
    """Poll ``url`` until it answers 200 (a server starting in another process)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} did not become ready")
            await asyncio.sleep(0.1)


@asynccontextmanager
async def proxy_process(
    env: Mapping[str, str],
    *args: str,
    capture_stderr: bool = False,
    module: str = "compaction_proxy",
    cwd: str | None = None,
    python: str | None = None,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``python -m compaction_proxy serve`` (or ``module``'s) on a free port; yields the process
    and its base URL (with ``capture_stderr``, read its log from ``process.stderr`` once it has
    stopped). With ``cwd`` another checkout's package runs (``-m`` puts it first on the path);
    with ``python``, under that interpreter (a venv's, holding the dependencies)."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *serve_argv(port, module, python),
        *args,
        env={**os.environ, **env},
        stderr=asyncio.subprocess.PIPE if capture_stderr else None,
        cwd=cwd,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_ready(f"{base}/healthz")
        yield process, base
    finally:
        await stop(process)


STOP_SECONDS = 60.0  # past the proxy's own shutdown_timeout (30 s) and a little more


async def stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, as an operator's orchestrator sends it; SIGKILL if the process has not exited
    ``STOP_SECONDS`` later, so a test never waits on it forever (and says so)."""
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(
            f"the proxy did not stop within {STOP_SECONDS:.0f} s of SIGTERM"
        ) from None


def children_of(pid: int) -> set[int]:
    """Live child processes of ``pid`` (from /proc)."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # after "(command name)": state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z":
            children.add(int(entry))
    return children


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
