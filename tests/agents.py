"""Running the real coding agents the end-to-end suite drives (Claude Code, Codex, opencode)
and an app on the Vercel AI SDK: where ``.ci/run`` installs them, and one headless run as a
subprocess."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import RunningProxy

AGENTS = Path(__file__).parents[1] / ".ci" / "agents" / "node_modules" / ".bin"
RUN_SECONDS = 240


def agent_binary(name: str, package: str) -> str:
    """The agent's executable, installed by ``.ci/run`` (or on ``PATH``); the test is skipped,
    naming the package, where it is not."""
    found = shutil.which(name, path=f"{AGENTS}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip(f"{name} is not installed (.ci/run installs {package})")
    return found


def ai_sdk_modules() -> Path:
    """Where ``.ci/run`` installs the Vercel AI SDK (``ai``, ``@ai-sdk/openai``,
    ``@ai-sdk/anthropic``) for the app the suite runs on it; the test is skipped where it or
    ``node`` is missing."""
    modules = AGENTS.parent
    providers = [modules / "@ai-sdk" / name for name in ("openai", "anthropic")]
    if not (modules / "ai").is_dir() or not all(path.is_dir() for path in providers):
        pytest.skip("the Vercel AI SDK is not installed (.ci/run installs ai and its providers)")
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    return modules


async def run_agent(command: list[str], env: dict[str, str], workdir: Path) -> tuple[int, str]:
    """Run ``command`` in ``workdir`` with ``env`` over this process's environment, no input;
    its exit status and everything it printed."""
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=RUN_SECONDS)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def assert_usage_recorded(proxy: RunningProxy) -> None:
    """Every request forwarded has its usage in the log (an agent that left at the terminal
    event without reading the stream's end included)."""
    for listed in await proxy.store.list_conversations():
        events = await proxy.read_log(listed.conversation, limit=10_000)
        usage = [e for e in events if e["type"] == "usage"]
        assert len(usage) == len([e for e in events if e["type"] == "request"]) > 0
