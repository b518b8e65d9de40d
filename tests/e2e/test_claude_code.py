"""Claude Code itself, headless (``claude -p``), through the proxy against a scripted model
whose window its history outgrows: it completes, and the proxy compacted. Pointed straight at
the same model, the run ends with the history too long. Skipped, with the reason, where the
pinned ``@anthropic-ai/claude-code`` is not installed (``.ci/run`` installs it)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_messages import shell_agent
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.agents import agent_binary, assert_usage_recorded, run_agent
from tests.conftest import ProxyFactory
from tests.helpers import (
    AGENT_KEY,
    HELD_KEY,
    assert_summary_calls_read_the_conversations_cache,
    counter,
    holding_the_key,
    route,
)

pytestmark = pytest.mark.slow

MODEL = "claude-scripted"
WINDOW = 64_000  # Claude Code asks for 32k of answer: 10.9k of its own prompt leaves ~20k
FILES = 6  # about 6k tokens each: the history outgrows the window by the fifth


def claude_binary() -> str:
    return agent_binary("claude", "@anthropic-ai/claude-code")


def data_files(folder: Path) -> list[str]:
    paths = []
    for index in range(FILES):
        path = folder / f"data_{index}.txt"
        lines = [f"row {index}.{row}: " + "value " * 20 for row in range(180)]
        if index == 0:
            lines.insert(0, "FACT-7: the importer's batch size is 512.")
        path.write_text("\n".join(lines))
        paths.append(str(path))
    return paths


async def run_claude(
    base_url: str, home: Path, workdir: Path, *arguments: str, key: str = "sk-ant-test"
) -> tuple[int, str]:
    """``claude -p`` with the task, or with ``arguments`` instead when given."""
    env = {
        "HOME": str(home),
        "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }
    task = "Print each data file with the shell, one per turn, then say you are done."
    asked = list(arguments) or [task]
    command = [claude_binary(), "-p", *asked, "--model", MODEL, "--dangerously-skip-permissions"]
    return await run_agent(command, env, workdir)


async def test_claude_code_completes_a_task_through_the_proxy_that_outgrows_its_window(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path, store_url: str
) -> None:
    claude_binary()
    files = data_files(tmp_path)
    fake.windows[MODEL] = WINDOW
    fake.messages.script = shell_agent(files)
    proxy = await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW)], store_url=store_url)
    left = counter("compaction_proxy_client_disconnects_total", route="claude-*")
    code, output = await run_claude(proxy.url.removesuffix("/v1"), tmp_path / "a", tmp_path)
    assert code == 0, output
    assert f"Read all {FILES} files." in output
    assert fake.messages.refused == []  # pairing and breakpoints as the API wants them
    assert fake.messages.overflows == []  # nothing over the window reached the model
    forwarded = [str(r.body) for r in fake.messages.received]
    compacted = [
        b for b in forwarded if "removed by compaction-proxy" in b or "<compacted-summary>" in b
    ]
    assert compacted  # the proxy is what kept it inside
    assert counter("compaction_proxy_client_disconnects_total", route="claude-*") == left
    await assert_usage_recorded(proxy)
    # Its summary calls name the user and session Claude Code's own requests name.
    named = {orjson.dumps(r.body.get("metadata")) for r in fake.messages.received}
    assert fake.messages.summary_requests
    for summary in fake.messages.summary_requests:
        assert summary.body.get("metadata") and orjson.dumps(summary.body["metadata"]) in named
    # They read from the provider's cache what Claude Code's own requests wrote.
    assert_summary_calls_read_the_conversations_cache(fake.messages.cache_reads)


async def test_claude_code_works_behind_a_proxy_holding_the_key(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shared gateway in owned mode: Claude Code authenticates with a client key of the
    proxy's, nothing it sends names an object of the account, and it completes, compacted,
    on the proxy's key."""
    claude_binary()
    files = data_files(tmp_path)
    fake.windows[MODEL] = WINDOW
    fake.messages.script = shell_agent(files)
    proxy = await holding_the_key(make_proxy, upstream_url, monkeypatch, "claude-*", WINDOW)
    base_url = proxy.url.removesuffix("/v1")
    code, output = await run_claude(base_url, tmp_path / "a", tmp_path, key=AGENT_KEY)
    assert code == 0, output
    assert f"Read all {FILES} files." in output
    assert fake.messages.refused == [] and fake.messages.overflows == []
    keys = {r.headers.get("x-api-key") for r in fake.messages.received}
    assert keys == {HELD_KEY}  # the client's key never left the proxy
    assert any("<compacted-summary>" in str(r.body) for r in fake.messages.received)


async def test_claude_code_pointed_straight_at_the_model_runs_out_of_window(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    """The witness: without the proxy the same run fails on its history's size."""
    claude_binary()
    fake.windows[MODEL] = WINDOW
    fake.messages.script = shell_agent(data_files(tmp_path))
    _, output = await run_claude(upstream_url.removesuffix("/v1"), tmp_path / "b", tmp_path)
    assert fake.messages.overflows, output


async def test_claude_codes_own_compaction_is_recognized_and_prepares_nothing(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path
) -> None:
    """``/compact`` in the session just run: Claude Code's summarization request (tools
    offered, "CRITICAL: Respond with TEXT ONLY", then its summary instructions) is its own
    compaction to the proxy."""
    claude_binary()
    fake.windows[MODEL] = WINDOW
    fake.messages.script = shell_agent(data_files(tmp_path)[:1])
    proxy = await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW)])
    base, home = proxy.url.removesuffix("/v1"), tmp_path / "c"
    own = counter("compaction_proxy_client_compactions_total", route="claude-*")
    code, output = await run_claude(base, home, tmp_path)
    assert code == 0, output
    assert counter("compaction_proxy_client_compactions_total", route="claude-*") == own
    code, output = await run_claude(base, home, tmp_path, "--continue", "/compact")
    assert code == 0, output
    # Each summarization request counts (Claude Code may ask twice for one /compact).
    assert counter("compaction_proxy_client_compactions_total", route="claude-*") >= own + 1
    assert proxy.app[SERVICES].background.in_flight == 0
