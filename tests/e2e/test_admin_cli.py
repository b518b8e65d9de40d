"""``compaction-proxy conversations …`` against a running proxy."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.cli import main
from tests.conftest import ProxyFactory, RunningProxy
from tests.e2e.test_admin import TOKEN, chat, history, routes


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, upstream_url: str) -> RunningProxy:
    return await make_proxy(admin_token=TOKEN, routes=routes(upstream_url))


async def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["conversations", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_cli_lists_shows_and_compacts(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_URL", proxy.root)
    messages = history()
    conversation = await chat(proxy, messages)

    code, out, _ = await cli(capsys, "list")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "CONVERSATION",
        "TENANT",
        "MODEL",
        "LAST",
        "SEEN",
        "GEN",
        "PRESSURE",
    ]
    assert conversation in out

    code, out, _ = await cli(capsys, "--json", "list")
    listed: dict[str, Any] = json.loads(out)
    assert listed["conversations"][0]["conversation"] == conversation

    code, out, _ = await cli(capsys, "compact", conversation)
    assert code == 0 and out.startswith("committed: ") and "generation 1" in out

    code, out, _ = await cli(capsys, "show", conversation)
    assert code == 0 and "generation    1" in out and "checkpoint" in out

    code, out, _ = await cli(capsys, "surface", conversation)
    assert code == 0 and out.splitlines()[2].split()[:3] == [
        "1",
        "checkpoint",
        f"0..{len(messages) - 5}",  # all but the live turn and the call it answers
    ]

    code, out, _ = await cli(capsys, "log", conversation, "--limit", "5")
    assert code == 0 and "(more: --after " in out

    code, _, err = await cli(capsys, "compact", conversation, "--start", "0", "--end", "99")
    assert code == 1 and "out of range" in err


async def test_cli_refusals_exit_non_zero(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await cli(capsys, "--url", proxy.root, "list")
    assert code == 1 and "no admin token" in err
    code, _, err = await cli(capsys, "--url", proxy.root, "--token", "wrong", "list")
    assert code == 1 and "HTTP 401" in err
    code, _, err = await cli(capsys, "--url", "http://127.0.0.1:9", "--token", "t", "list")
    assert code == 1 and "cannot reach" in err
