"""Codex and opencode as their users run them, through the proxy, against a scripted model
whose 16k window their history outgrows (``testing.fake_agent``: one ~24 KB data file printed
per turn, then an answer). Each run completes with nothing over the window reaching the model,
pairing valid, the proxy having compacted, no request counted as a client disconnect and usage
recorded; pointed straight at the model, the same run overflows. Skipped, with the reason,
where the pinned agents are not installed (``.ci/run`` installs them)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_agent import FileReader, data_file
from compaction_proxy.testing.fake_answers import is_summary_request
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
from tests.reports import REAL_AGENTS, report

pytestmark = pytest.mark.slow

MODEL = "agent-scripted"
WINDOW = 16_000
FILES = 5
TASK = "Print each data file with the shell, one per turn, then say you are done."
# opencode's prompt (10 tools) is about 9.8k tokens and it asks for 4,096 of answer: in a 16k
# window a 24 KB output would not fit even as the only one; 12 KB outputs do, and their
# history outgrows the window by the third.
OPENCODE_FILE_CHARS = 12_000


def data_files(folder: Path, size: int = 24_000, count: int = FILES) -> list[str]:
    """``count`` data files (``size`` characters each), written into ``folder``: their
    absolute paths (an agent's shell may run elsewhere than where it was started)."""
    paths = []
    for index in range(count):
        path = folder / f"data_{index}.txt"
        path.write_text(data_file(index, size))
        paths.append(str(path))
    return paths


def codex_config(home: Path, base_url: str, own_window: int | None = None) -> Path:
    """A fresh ``CODEX_HOME``: the provider at ``base_url``, speaking Responses, and windows
    set so that compaction is left to the proxy (Codex never compacts on its own), or, with
    ``own_window``, so that Codex compacts on its own as it nears that window."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True)
    window = own_window or 1_000_000
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "proxy"\n'
        f"model_context_window = {window}\n"
        f"model_auto_compact_token_limit = {window * 8 // 10}\n"
        "[model_providers.proxy]\n"
        'name = "compaction-proxy"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "PROXY_API_KEY"\n'
    )
    return codex_home


async def codex_exec(
    codex_home: Path, home: Path, workdir: Path, key: str, secret: str = "sk-codex"
) -> tuple[int, str]:
    """``codex exec`` on the task, with ``CODEX_HOME`` and ``secret`` in environment ``key``."""
    command = [
        agent_binary("codex", "@openai/codex"),
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "danger-full-access",
        TASK,
    ]
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), key: secret}
    return await run_agent(command, env, workdir)


async def run_codex(
    base_url: str, home: Path, workdir: Path, own_window: int | None = None
) -> tuple[int, str]:
    codex_home = codex_config(home, base_url, own_window)
    return await codex_exec(codex_home, home, workdir, "PROXY_API_KEY")


async def run_codex_remote_compacting(
    base_url: str, home: Path, workdir: Path, own_window: int = WINDOW, key: str | None = None
) -> tuple[int, str]:
    """Codex on its built-in OpenAI provider at ``base_url`` (a WebSocket first, as to
    OpenAI), told its window is ``own_window``: near it, it compacts remotely, a Responses
    request ending with a ``compaction_trigger`` that must be answered with exactly one
    ``compaction`` item, which it sends back from then on. With ``key``, it authenticates with
    it (``CODEX_API_KEY``: on this provider Codex does not send ``OPENAI_API_KEY``)."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        f'openai_base_url = "{base_url}"\n'
        f"model_context_window = {own_window}\n"
        f"model_auto_compact_token_limit = {own_window * 8 // 10}\n"
    )
    if key is not None:
        return await codex_exec(codex_home, home, workdir, "CODEX_API_KEY", key)
    return await codex_exec(codex_home, home, workdir, "OPENAI_API_KEY")


REMOTE_COMPACTION_FAILED = "expected exactly one compaction output item"
WEBSOCKET_FALLBACK = "Falling back from WebSockets to HTTPS transport"


def carried_checkpoints(fake: FakeUpstream) -> set[str]:
    """The distinct checkpoints the requests forwarded for the agent carried."""
    found: set[str] = set()
    for body in fake.responses.forwarded:
        found.update(re.findall(r"<compacted-summary>(.*?)</compacted-summary>", str(body), re.S))
    return found


def opencode_env(home: Path, base_url: str) -> dict[str, str]:
    """Isolated XDG directories, and an ``@ai-sdk/openai-compatible`` provider at
    ``base_url`` whose model declares a window large enough that compaction is left to the
    proxy."""
    config = home / "config" / "opencode"
    config.mkdir(parents=True)
    model = {"name": MODEL, "limit": {"context": 1_000_000, "output": 4096}}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "compaction-proxy",
        "options": {"baseURL": base_url, "apiKey": "sk-opencode"},
        "models": {MODEL: model},
    }
    settings = {
        "provider": {"proxy": provider},
        "model": f"proxy/{MODEL}",
        "autoupdate": False,
        "permission": {"bash": "allow", "external_directory": "allow"},  # headless: no one asks
    }
    (config / "opencode.json").write_text(json.dumps(settings))
    return {
        "HOME": str(home),
        **{
            f"XDG_{kind.upper()}_HOME": str(home / kind)
            for kind in ("config", "data", "cache", "state")
        },
    }


async def run_opencode(base_url: str, home: Path, workdir: Path) -> tuple[int, str]:
    command = [agent_binary("opencode", "opencode-ai"), "run", TASK]
    return await run_agent(command, opencode_env(home, base_url), workdir)


def disconnects() -> float:
    return counter("compaction_proxy_client_disconnects_total", route="agent-*")


def forwarded_compacted(bodies: list[Any]) -> bool:
    return any(
        "removed by compaction-proxy" in str(b) or "<compacted-summary>" in str(b) for b in bodies
    )


def assert_pruned_bytes_stay_pruned(outputs: list[dict[str, str]]) -> None:
    """``outputs``: per forwarded request, each tool output it carried by call id. Once an
    output went out cut by the proxy, every later request that carries it carries the same
    bytes (the provider's prompt cache holds, as the README promises)."""
    cut: dict[str, str] = {}
    for request in outputs:
        for call_id, sent in request.items():
            if call_id in cut:
                assert sent == cut[call_id], f"{call_id} went out cut, then otherwise"
            elif "removed by compaction-proxy" in sent:
                cut[call_id] = sent


def responses_outputs(bodies: list[Any]) -> list[dict[str, str]]:
    return [
        {
            str(item.get("call_id")): json.dumps(item.get("output"))
            for item in body.get("input", [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
        for body in bodies
    ]


def chat_outputs(bodies: list[Any]) -> list[dict[str, str]]:
    return [
        {
            str(m.get("tool_call_id")): json.dumps(m.get("content"))
            for m in body.get("messages", [])
            if m.get("role") == "tool"
        }
        for body in bodies
    ]


async def test_codex_completes_through_the_proxy_a_task_that_outgrows_its_window(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path, store_url: str
) -> None:
    """Eight files, a summarizer that takes a second (checkpoints are prepared while Codex
    goes on, and requests go at once with the bridge's cuts meanwhile); on either store."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.summary_delay = 1.0
    fake.responses.agent = FileReader(data_files(tmp_path, count=8))
    proxy = await make_proxy(routes=[route(upstream_url, "agent-*", WINDOW)], store_url=store_url)
    left_before = disconnects()
    code, output = await run_codex(proxy.url, tmp_path / "home", tmp_path)
    assert code == 0, output
    assert "Read all 8 files." in output, output
    received = fake.responses.forwarded
    assert fake.responses.refused == [] and fake.responses.overflows == []
    assert forwarded_compacted(received)
    assert_pruned_bytes_stay_pruned(responses_outputs(received))
    assert disconnects() == left_before
    await assert_usage_recorded(proxy)
    # Summary calls in Codex's own form go to the cache its requests name.
    keys = {body.get("prompt_cache_key") for body in received} - {None}
    calls = [body for body in fake.responses.received if is_summary_request(body)]
    assert keys and calls and all(call.get("prompt_cache_key") in keys for call in calls)
    # So they read from the provider's cache what Codex's own requests wrote.
    assert_summary_calls_read_the_conversations_cache(fake.responses.cache_reads)


async def test_codex_compacting_on_its_own_wastes_no_summary_of_the_proxy(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path
) -> None:
    """Codex told its window is 16k compacts its own history (a summarization request with no
    tools, then a history replaced by its summary). The proxy prepares checkpoints from half
    the window, with a summarizer that takes a second: the round in flight when Codex asks for
    its summary is cancelled, and once Codex has compacted on its own, nothing more is
    prepared in the background. No checkpoint is committed that no request carries."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.responses.agent = FileReader(data_files(tmp_path))
    fake.summary_delay = 1.0
    proxy = await make_proxy(routes=[route(upstream_url, "agent-*", WINDOW, precompact_ratio=0.5)])
    own = counter("compaction_proxy_client_compactions_total", route="agent-*")
    code, output = await run_codex(proxy.url, tmp_path / "home", tmp_path, own_window=WINDOW)
    assert code == 0, output
    assert f"Read all {FILES} files." in output, output
    assert fake.responses.refused == [] and fake.responses.overflows == []
    await proxy.app[SERVICES].background.idle()
    client_compactions = counter("compaction_proxy_client_compactions_total", route="agent-*") - own
    assert client_compactions >= 1
    committed = [
        e
        for e in await proxy.read_log((await proxy.store.list_conversations())[0].conversation)
        if e["type"] == "compaction/end"
        and e.get("outcome") == "committed"
        and e.get("kind") == "summary"
    ]
    assert len(committed) <= len(carried_checkpoints(fake))  # every checkpoint used
    report(
        REAL_AGENTS,
        f"codex compacting on its own: {client_compactions:.0f} client compactions, "
        f"{len(fake.summary_requests)} summary calls of the proxy, {len(committed)} committed, "
        f"{len(carried_checkpoints(fake))} carried",
    )


async def test_codex_pointed_straight_at_the_model_runs_out_of_window(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    """The witness: without the proxy the same run overflows."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.responses.agent = FileReader(data_files(tmp_path))
    _, output = await run_codex(upstream_url, tmp_path / "home", tmp_path)
    assert fake.responses.overflows, output


async def test_opencode_completes_through_the_proxy_a_task_that_outgrows_its_window(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path, store_url: str
) -> None:
    agent_binary("opencode", "opencode-ai")
    fake.windows[MODEL] = WINDOW
    fake.agent = FileReader(data_files(tmp_path, OPENCODE_FILE_CHARS))
    proxy = await make_proxy(routes=[route(upstream_url, "agent-*", WINDOW)], store_url=store_url)
    left_before = disconnects()
    code, output = await run_opencode(proxy.url, tmp_path / "home", tmp_path)
    assert code == 0, output
    assert f"Read all {FILES} files." in output, output
    assert fake.rejected == [] and fake.overflows == []
    assert forwarded_compacted([r.body for r in fake.chat_requests])
    assert_pruned_bytes_stay_pruned(chat_outputs([r.body for r in fake.chat_requests]))
    assert disconnects() == left_before
    await assert_usage_recorded(proxy)
    assert_summary_calls_read_the_conversations_cache(fake.cache_reads)


async def test_opencode_pointed_straight_at_the_model_runs_out_of_window(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    """The witness: without the proxy the same run overflows."""
    agent_binary("opencode", "opencode-ai")
    fake.windows[MODEL] = WINDOW
    fake.agent = FileReader(data_files(tmp_path, OPENCODE_FILE_CHARS))
    _, output = await run_opencode(upstream_url, tmp_path / "home", tmp_path)
    assert fake.overflows, output


async def test_codex_remote_compaction_succeeds_through_the_proxy(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path
) -> None:
    """Codex's remote compaction against an upstream that has none: the proxy answers the
    trigger with its own compaction item, and Codex's next requests carry it, opened into the
    proxy's checkpoint before they reach the model."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.responses.agent = FileReader(data_files(tmp_path))
    proxy = await make_proxy(routes=[route(upstream_url, "agent-*", WINDOW)])
    served = counter("compaction_proxy_requests_total", route="agent-*", outcome="compacted")
    code, output = await run_codex_remote_compacting(proxy.url, tmp_path / "home", tmp_path)
    assert code == 0, output
    assert f"Read all {FILES} files." in output, output
    assert REMOTE_COMPACTION_FAILED not in output, output
    assert WEBSOCKET_FALLBACK not in output, output  # its socket was served, every turn
    triggers = counter("compaction_proxy_requests_total", route="agent-*", outcome="compacted")
    assert triggers - served >= 1
    forwarded = fake.responses.forwarded
    assert all("compaction_trigger" not in str(body) for body in forwarded)
    assert any("<compacted-summary>" in str(body["input"]) for body in forwarded)
    assert fake.responses.overflows == []
    report(
        REAL_AGENTS, f"codex remote compaction through the proxy: {triggers - served:.0f} served"
    )


async def test_codex_on_its_own_provider_is_compacted_by_the_proxy_over_its_websocket(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, tmp_path: Path, store_url: str
) -> None:
    """Codex on its built-in provider, its window left to the proxy: every turn goes over
    the WebSocket it opens (no fallback to HTTP), and the proxy keeps them in the model's
    window, none of them relayed past it; on either store."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.responses.agent = FileReader(data_files(tmp_path, count=8))
    proxy = await make_proxy(routes=[route(upstream_url, "agent-*", WINDOW)], store_url=store_url)
    sockets = counter("compaction_proxy_socket_sessions_total", format="responses")
    code, output = await run_codex_remote_compacting(
        proxy.url, tmp_path / "home", tmp_path, own_window=1_000_000
    )
    assert code == 0, output
    assert "Read all 8 files." in output, output
    assert WEBSOCKET_FALLBACK not in output, output
    assert counter("compaction_proxy_socket_sessions_total", format="responses") > sockets
    assert fake.responses.sockets == 0  # nothing went past the proxy
    received = fake.responses.forwarded
    assert fake.responses.refused == [] and fake.responses.overflows == []
    assert forwarded_compacted(received)
    assert all("previous_response_id" not in body for body in received)


@pytest.mark.parametrize("account_endpoints", ["refused", "owned"])
async def test_codex_on_its_own_provider_works_behind_a_proxy_holding_the_key(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    account_endpoints: str,
) -> None:
    """A shared gateway: the proxy holds the upstream key, and Codex authenticates with a
    client key of the proxy's. Every request names Codex's own session as ``thread_id`` in
    its ``client_metadata``: a label of the client's, no object of the account, so it is
    neither refused nor made to own anything, and the run completes over its socket."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.responses.agent = FileReader(data_files(tmp_path, count=8))
    proxy = await holding_the_key(
        make_proxy, upstream_url, monkeypatch, "agent-*", WINDOW, account_endpoints
    )
    code, output = await run_codex_remote_compacting(
        proxy.url, tmp_path / "home", tmp_path, own_window=1_000_000, key=AGENT_KEY
    )
    assert code == 0, output
    assert "Read all 8 files." in output, output
    assert WEBSOCKET_FALLBACK not in output, output
    assert fake.responses.refused == [] and fake.responses.overflows == []
    assert forwarded_compacted(fake.responses.forwarded)
    sent = {headers.get("Authorization") for headers in fake.responses.headers_received}
    assert sent == {f"Bearer {HELD_KEY}"}  # the client's key never left the proxy


async def test_codex_remote_compaction_fails_straight_at_an_upstream_without_it(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    """The witness: pointed straight at the model, Codex's remote compaction fails."""
    agent_binary("codex", "@openai/codex")
    fake.windows[MODEL] = WINDOW
    fake.responses.agent = FileReader(data_files(tmp_path))
    _, output = await run_codex_remote_compacting(upstream_url, tmp_path / "home", tmp_path)
    assert REMOTE_COMPACTION_FAILED in output, output
