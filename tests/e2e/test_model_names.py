"""A model name is client text: bounded in length, never kept without bound, never able to
start a log line of its own."""

from __future__ import annotations

import logging

import aiohttp
import orjson
import pytest

from compaction_proxy.compaction.model_policy import PolicyBook
from compaction_proxy.config.settings import load_settings
from compaction_proxy.metering.windows import LearnedWindows
from compaction_proxy.ops.cli import OneLineFormatter
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import RunningProxy

TOO_LONG = "m" * 257


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"model": TOO_LONG, "messages": [{"role": "user", "content": "x"}]}),
        ("/responses", {"model": TOO_LONG, "input": "hello"}),
        ("/embeddings", {"model": TOO_LONG, "input": "hello"}),
    ],
)
async def test_a_model_name_over_256_characters_is_a_400_naming_the_model(
    proxy: RunningProxy, fake: FakeUpstream, path: str, body: dict[str, object]
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{proxy.url}{path}",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        ) as answer:
            assert answer.status == 400
            error = (await answer.json())["error"]
    assert error["param"] == "model" and "256" in error["message"]
    assert fake.received == [] and fake.responses.received == []
    assert fake.endpoints.requests == []


async def test_a_model_name_with_a_line_break_cannot_forge_a_log_line(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    forged = "unknown-model\n2026-12-03 12:00:00 ERROR compaction_proxy: forged"
    body = {"model": forged, "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json=body) as answer:
            await answer.read()
    logged = [r.getMessage() for r in caplog.records]
    assert any("unknown-model" in line for line in logged)
    assert not [line for line in logged if "\n" in line or "\r" in line]


def test_what_is_kept_per_model_name_is_bounded() -> None:
    windows = LearnedWindows(max_models=100)
    policies = PolicyBook(load_settings(None), max_models=100)
    for n in range(5_000):
        name = f"model-{n}-" + "x" * 200
        windows.warn_unknown_once("*", name)
        windows.learn("*", "tenant", name, 1000 + n)
        policies.for_model(name)
    assert windows.size <= 200 and policies.size <= 100
    # The most recent are still known.
    assert windows.get("*", "tenant", f"model-4999-{'x' * 200}") == 5999


def test_the_log_format_writes_a_message_with_line_breaks_on_one_line() -> None:
    formatter = OneLineFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord(
        "compaction_proxy", logging.WARNING, __file__, 1, "model %s", ("a\nERROR x\r",), None
    )
    assert formatter.format(record) == "WARNING compaction_proxy: model a\\nERROR x\\r"
