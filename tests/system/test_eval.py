"""``compaction-proxy eval`` as a user runs it (the command, as a process), against a fake
model that answers from what it is shown (``testing.fake_probe_model``): a fact in view is
answered right, one summarized away is not. Two policies differ in their summary model alone:
one whose summaries keep the newest fact lines their cap allows, one whose summaries keep
none. The harness must rank the second below the first, and its report's numbers must add
up; probes the model writes are asked beside the rules'."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.ops.evaluate import conversation_in_store
from compaction_proxy.testing.fake_probe_model import FakeProbeModel
from tests.conftest import ProxyFactory
from tests.helpers import chat
from tests.redis_server import RedisServer
from tests.synthetic import synthetic_transcripts
from tests.transcripts import transcript_paths

POLICIES = {
    "careful summaries": {"masking": {"enabled": False}},
    "forgetful summaries": {"masking": {"enabled": False}, "summary_model": "forgetful-1"},
}


def conversation(folder: Path) -> Path:
    """A shared transcript where there are some, else the synthetic agent run."""
    shared = [p for p in transcript_paths() if "13768" in p.name]
    if shared:
        return shared[0]
    path = folder / "synthetic-tools.json"
    path.write_text(json.dumps(synthetic_transcripts()["synthetic-tools"]))
    return path


async def run_eval(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The command's exit status and output. One that outlives its time is made to print
    every thread's stack (faulthandler, on SIGABRT) before the test fails with it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "compaction_proxy",
        "eval",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    reading = asyncio.ensure_future(process.communicate())
    done, _ = await asyncio.wait({reading}, timeout=240)
    if not done:
        process.send_signal(signal.SIGABRT)
        output, _ = await reading
        pytest.fail(f"eval did not end in 240 s; its stacks:\n{output.decode()[-6000:]}")
    output, _ = reading.result()
    assert process.returncode is not None
    return process.returncode, output.decode()


def check_numbers(policy: dict[str, Any]) -> None:
    """What a report row says adds up."""
    overall = policy["retention"]
    by_kind = policy["by_kind"].values()
    assert overall["probes"] == sum(k["probes"] for k in by_kind) <= policy["probes_asked"]
    assert overall["right"] == sum(k["right"] for k in by_kind) <= overall["probes"]
    for row in (overall, *by_kind):
        if row["probes"]:
            assert row["retention"] == pytest.approx(row["right"] / row["probes"])
            low, high = row["interval"]
            assert 0 <= low <= row["retention"] <= high <= 1
        else:
            assert row["retention"] is None
    assert 0 < policy["forwarded_tokens"] < policy["raw_tokens"]
    assert policy["forwarded_share"] == pytest.approx(
        policy["forwarded_tokens"] / policy["raw_tokens"], abs=1e-4
    )
    assert policy["summary_calls"] >= 1 and policy["change_points"] >= 1


@pytest.mark.slow  # two replays of an agent run and their probes: about half a minute
async def test_the_harness_ranks_a_policy_that_drops_facts_below_one_that_keeps_them(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    model = FakeProbeModel()
    base = str((await aiohttp_server(model.app())).make_url("/v1"))
    policies = tmp_path / "policies.json"
    policies.write_text(json.dumps(POLICIES))
    report, chart = tmp_path / "report.json", tmp_path / "report.html"
    code, output = await run_eval(
        str(conversation(tmp_path)),
        "--base-url", base,
        "--model", "eval-model",
        "--window", "16000",
        "--policies", str(policies),
        "--probes", "30",
        "--model-probes", "4",
        "--no-cache",
        "--json", str(report),
        "--html", str(chart),
    )  # fmt: skip
    assert code == 0, output
    rows = {p["name"]: p for p in json.loads(report.read_text())["policies"]}
    careful, forgetful = rows["careful summaries"], rows["forgetful summaries"]
    for row in rows.values():
        check_numbers(row)
    assert careful["retention"]["retention"] > forgetful["retention"]["retention"]
    # Probes written by the model, one call each at up to four points that removed something
    # new (each checkpoint here), asked beside the rules'.
    written = [row["probes_generated"] for row in rows.values()]
    assert all(1 <= count <= 4 for count in written)
    assert model.written == sum(min(4, row["summary_calls"]) for row in rows.values())
    # Billed on the route's prices: no --preset, the defaults' pricing (auto) for OpenAI.
    assert careful["prices"] == {"read": 0.1, "write": 1.0, "output": 8.0}
    assert careful["retention"]["interval"][0] > forgetful["retention"]["interval"][1]
    # Every probe asked twice (the whole history fits this model's 16k? not always: then once).
    asked = sum(p["probes_asked"] for p in rows.values())
    assert asked <= len(model.asked) <= 2 * asked
    assert "careful summaries" in output and "retention" in output  # the terminal table
    assert "<svg" in chart.read_text() and "forgetful summaries" in chart.read_text()


async def test_a_dry_run_prints_the_calls_it_would_make_and_asks_nothing(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    model = FakeProbeModel()
    base = str((await aiohttp_server(model.app())).make_url("/v1"))
    path = tmp_path / "short.json"
    path.write_text(json.dumps(synthetic_transcripts()["synthetic-tools"][:40]))
    code, output = await run_eval(
        str(path), "--base-url", base, "--model", "m", "--window", "8000", "--dry-run",
        "--model-probes", "3",
    )  # fmt: skip
    assert code == 0, output
    assert "would make" in output and "probe calls" in output
    assert "with 3 probes the model writes" in output
    assert model.asked == [] and model.summaries == 0 and model.written == 0


async def test_against_a_real_openai_compatible_server(tmp_path: Path) -> None:
    """Unchanged against a real server: ``EVAL_BASE_URL``, ``EVAL_MODEL`` and the key in
    ``EVAL_API_KEY``."""
    base = os.environ.get("EVAL_BASE_URL")
    if not base:
        pytest.skip("EVAL_BASE_URL is not set: no real OpenAI-compatible server to ask")
    path = tmp_path / "short.json"
    path.write_text(json.dumps(synthetic_transcripts()["synthetic-tools"][:60]))
    report = tmp_path / "report.json"
    code, output = await run_eval(
        str(path),
        "--base-url", base,
        "--model", os.environ.get("EVAL_MODEL", "gpt-4o-mini"),
        "--api-key-env", "EVAL_API_KEY",
        "--window", "16000",
        "--probes", "6",
        "--json", str(report),
    )  # fmt: skip
    assert code == 0, output
    for row in json.loads(report.read_text())["policies"]:
        check_numbers(row)


async def test_a_conversation_the_proxy_logged_is_read_back_from_its_store(
    make_proxy: ProxyFactory, private_redis: RedisServer
) -> None:
    """By id: the head of its last context, then its messages along their chain, as its
    newest request carried them."""
    proxy = await make_proxy(store_url=private_redis.url)
    messages = synthetic_transcripts()["synthetic-tools"][:12]
    requests = [messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant" and i]
    for history in requests:
        await chat(proxy.url, history, "small-model")
    await proxy.app[SERVICES].pending_log_writes.settled_all()
    (listed,) = await proxy.store.list_conversations()
    found = await conversation_in_store(private_redis.url, listed.conversation)
    assert found == requests[-1]


async def test_an_anthropic_compatible_model_ranks_the_policies_alike(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    """``--api anthropic``: the probes, summaries and grading go to the Messages API."""
    model = FakeProbeModel()
    base = str((await aiohttp_server(model.app())).make_url("/v1"))
    policies = tmp_path / "policies.json"
    policies.write_text(json.dumps(POLICIES))
    path = tmp_path / "short.json"
    path.write_text(json.dumps(synthetic_transcripts()["synthetic-tools"][:80]))
    report = tmp_path / "report.json"
    code, output = await run_eval(
        str(path),
        "--api", "anthropic",
        "--base-url", base,
        "--model", "claude-eval",
        "--window", "8000",
        "--policies", str(policies),
        "--probes", "12",
        "--no-cache",
        "--json", str(report),
    )  # fmt: skip
    assert code == 0, output
    rows = {p["name"]: p for p in json.loads(report.read_text())["policies"]}
    kept = rows["careful summaries"]["retention"]["retention"]
    assert kept > rows["forgetful summaries"]["retention"]["retention"]
    assert model.asked and model.summaries
