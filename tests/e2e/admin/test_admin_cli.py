"""``compaction-proxy conversations …`` against a running proxy."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from compaction_proxy.ops.cli import main
from compaction_proxy.store.base import StoreUnavailable
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import RunningProxy
from tests.helpers import (
    ADMIN_MODEL,
    ADMIN_TOKEN,
    admin_history,
    conversation_of,
)


async def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["conversations", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_cli_lists_shows_and_compacts(
    proxy: RunningProxy,
    fake: FakeUpstream,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_URL", proxy.root)
    messages = admin_history()
    conversation = await conversation_of(proxy, messages, session="fix-the-cache-race")

    code, out, _ = await cli(capsys, "list")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "CONVERSATION",
        "SESSION",
        "TENANT",
        "MODEL",
        "LAST",
        "SEEN",
        "GEN",
        "PRESSURE",
    ]
    assert conversation in out and "fix-the-cache-race" in out

    code, out, _ = await cli(capsys, "show", conversation)
    shown = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    assert shown["session"] == "fix-the-cache-race" and shown["model"] == ADMIN_MODEL
    assert shown["compaction"] == "on" and shown["pressure"].endswith("%")
    assert "UTC" in shown["last"] and len(shown["tenant"]) >= 12

    code, out, _ = await cli(capsys, "--json", "list")
    listed: dict[str, Any] = json.loads(out)
    assert listed["conversations"][0]["conversation"] == conversation

    code, out, _ = await cli(
        capsys, "compact", conversation, "--upstream-query", "api-version=2024-10-21"
    )
    assert code == 0 and out.startswith("committed: ")
    generation = out.rsplit("generation ", 1)[1].strip()
    assert generation.isdigit() and int(generation) > 0
    assert fake.summary_requests[-1].query == "api-version=2024-10-21"

    code, out, _ = await cli(capsys, "show", conversation)
    assert code == 0 and f"generation    {generation}" in out and "checkpoint" in out

    code, out, _ = await cli(capsys, "surface", conversation)
    rows = out.splitlines()
    assert code == 0 and rows[2].split()[:3] == [
        "1",
        "checkpoint",
        f"0..{len(messages) - 5}",  # all but the live turn and the call it answers
    ]
    assert rows[0].split()[4] == "TOKENS" and int(rows[2].split()[4]) > 0
    assert 'bash({"command": "step 7"})' in out  # tool calls are shown, with arguments
    assert rows[-1].endswith("tokens")

    code, out, _ = await cli(capsys, "log", conversation, "--limit", "5")
    assert code == 0 and "(more: --after " in out
    assert out.splitlines()[0].split()[:3] == ["ID", "TIME", "(UTC)"]
    assert time.strftime("%Y-%m-%d", time.gmtime()) in out

    code, _, err = await cli(capsys, "compact", conversation, "--start", "0", "--end", "99")
    assert code == 1 and "out of range" in err


async def test_a_session_name_from_the_listing_names_its_conversation(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_URL", proxy.root)
    name = "issue-42:cache.race"
    conversation = await conversation_of(proxy, admin_history(), session=name)
    for action in ("show", "surface", "log"):
        code, out, err = await cli(capsys, action, name)
        assert code == 0, (action, err)
    code, out, _ = await cli(capsys, "--json", "show", name)
    assert json.loads(out)["conversation"] == conversation

    other = await conversation_of(proxy, admin_history(), session=name, api_key="sk-other")
    assert other != conversation  # another tenant's conversation of the same name
    code, _, err = await cli(capsys, "show", name)
    assert code == 1 and "2 conversations have the session name" in err
    assert conversation in err and other in err
    code, out, _ = await cli(capsys, "--json", "show", other)
    assert code == 0 and json.loads(out)["conversation"] == other

    code, _, err = await cli(capsys, "show", "no-such-session")
    assert code == 1 and "HTTP 404" in err


async def test_cli_refusals_exit_non_zero(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await cli(capsys, "--url", proxy.root, "list")
    assert code == 1 and "no admin token" in err
    code, _, err = await cli(capsys, "--url", proxy.root, "--token", "wrong", "list")
    assert code == 1 and "HTTP 401" in err
    code, _, err = await cli(capsys, "--url", "http://127.0.0.1:9", "--token", "t", "list")
    assert code == 1 and "cannot reach" in err


async def test_options_work_after_the_action_and_a_v1_url_is_forgiven(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    code, out, _ = await cli(capsys, "list", "--json", "--url", proxy.url, "--token", ADMIN_TOKEN)
    assert code == 0
    assert json.loads(out)["conversations"][0]["conversation"] == conversation


async def test_a_store_outage_is_one_line_and_a_failure_for_every_view(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation = await conversation_of(proxy, admin_history())

    async def unavailable(*_: Any, **__: Any) -> Any:
        raise StoreUnavailable("read", "ConnectionError")

    for method in ("load", "read_log", "list_conversations"):
        monkeypatch.setattr(proxy.store, method, unavailable)
    for args in (
        ["list"],
        ["show", conversation],
        ["log", conversation],
        ["surface", conversation],
    ):
        for json_flag in ([], ["--json"]):
            code, out, err = await cli(
                capsys, "--url", proxy.root, "--token", ADMIN_TOKEN, *json_flag, *args
            )
            assert code == 1 and out == "", (args, out)
            assert "HTTP 503: the store is unavailable" in err and "Traceback" not in err


async def test_a_failed_manual_compaction_says_why(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str], fake: FakeUpstream
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    refusal = {
        "error": {
            "message": "Incorrect API key provided: sk-****.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    fake.fail_next(401, json.dumps(refusal).encode())
    code, out, _ = await cli(
        capsys, "--url", proxy.root, "--token", ADMIN_TOKEN, "compact", conversation
    )
    assert code == 1
    assert out.startswith("summary_failed: the summary call failed (http_401: Incorrect API key")
    assert "api_key_env" in out


async def test_a_region_given_backwards_is_named(
    proxy: RunningProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    code, _, err = await cli(
        capsys,
        "--url",
        proxy.root,
        "--token",
        ADMIN_TOKEN,
        "compact",
        conversation,
        "--start",
        "3",
        "--end",
        "1",
    )
    assert code == 1 and "--start (3) is after --end (1)" in err
