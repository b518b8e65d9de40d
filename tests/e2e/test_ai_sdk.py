"""An app on the Vercel AI SDK (``ai`` with ``@ai-sdk/openai`` and ``@ai-sdk/anthropic``, run
by ``node``) through the proxy: a shell agent against a scripted model whose window its history
outgrows, in two user turns, over the Responses API and over Anthropic's Messages API. On
Responses the SDK keeps ``store`` on by default and sends each earlier answer back as an
``item_reference``, which the provider reads as the stored item: the proxy forwards the
references, compacts around them, and under a key it holds serves each client its own. Pointed
straight at the same model, the app runs out of window. Skipped, with the reason, where
``.ci/run`` has not installed the SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.testing.fake_agent import FileReader, data_file
from compaction_proxy.testing.fake_messages import shell_agent
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.agents import ai_sdk_modules, run_agent
from tests.conftest import ProxyFactory
from tests.helpers import AGENT_KEY, holding_the_key, route

pytestmark = pytest.mark.slow

APP = Path(__file__).parent / "apps" / "ai_sdk_agent.mjs"
MODEL = "gpt-scripted"
CLAUDE = "claude-scripted"
WINDOW = 16_000
FILES = 8  # about 6k tokens each: the history outgrows the window by the third


async def run_app(
    base_url: str, key: str, mode: str, workdir: Path, api: str = "responses"
) -> tuple[int, str]:
    env = {"AI_SDK_MODULES": str(ai_sdk_modules())}
    model = CLAUDE if api == "messages" else MODEL
    return await run_agent(["node", str(APP), base_url, key, model, mode, api], env, workdir)


def script(fake: FakeUpstream, folder: Path) -> None:
    paths = []
    for index in range(FILES):
        path = folder / f"data_{index}.txt"
        path.write_text(data_file(index))
        paths.append(str(path))
    fake.windows[MODEL] = fake.windows[CLAUDE] = WINDOW
    fake.responses.agent = FileReader(paths)
    fake.messages.script = shell_agent(paths, tool="bash")


def references(body: dict[str, Any]) -> int:
    items = body.get("input")
    listed = items if isinstance(items, list) else []
    return sum(1 for i in listed if isinstance(i, dict) and i.get("type") == "item_reference")


def answered(fake: FakeUpstream, api: str) -> tuple[list[dict[str, Any]], list[Any], list[int]]:
    """What the scripted model of ``api`` received for the app (the proxy's summary calls left
    out on Responses), what it refused, and the prompts it refused as over its window."""
    if api == "messages":
        bodies = [request.body for request in fake.messages.received]
        return bodies, fake.messages.refused, fake.messages.overflows
    return fake.responses.forwarded, fake.responses.refused, fake.responses.overflows


@pytest.mark.parametrize("mode", ["whole", "stream"])
@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_an_ai_sdk_app_completes_through_the_proxy_compacted(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    tmp_path: Path,
    api: str,
    mode: str,
) -> None:
    """On Responses its references go on as the SDK sent them, for the provider to read."""
    ai_sdk_modules()
    script(fake, tmp_path)
    model = CLAUDE if api == "messages" else MODEL
    proxy = await make_proxy(routes=[route(upstream_url, model, WINDOW)])
    code, output = await run_app(proxy.url, "sk-test", mode, tmp_path, api)
    assert code == 0, output
    assert output.count(f"ANSWER: Read all {FILES} files.") == 2, output
    bodies, refused, overflows = answered(fake, api)
    assert refused == [] and overflows == []
    if api == "responses":
        assert any(references(body) for body in bodies)  # the SDK's, read by the provider
    compacted = [b for b in map(str, bodies) if "compacted-summary" in b or "removed by" in b]
    assert compacted  # the proxy is what kept it inside


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_an_ai_sdk_app_pointed_straight_at_the_model_runs_out_of_window(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path, api: str
) -> None:
    """The witness: without the proxy the same app overflows."""
    ai_sdk_modules()
    script(fake, tmp_path)
    code, output = await run_app(upstream_url, "sk-test", "whole", tmp_path, api)
    assert code != 0 and answered(fake, api)[2], output


async def test_an_ai_sdk_app_under_a_held_key_is_served_its_own_references(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In owned mode every answer's items are recorded as the client's, from a whole answer
    or a stream's last event, so its references are served as the provider would serve them."""
    ai_sdk_modules()
    script(fake, tmp_path)
    proxy = await holding_the_key(make_proxy, upstream_url, monkeypatch, MODEL, WINDOW)
    for mode in ("whole", "stream"):
        code, output = await run_app(proxy.url, AGENT_KEY, mode, tmp_path)
        assert code == 0, output
        assert output.count(f"ANSWER: Read all {FILES} files.") == 2, output
    assert any(references(body) for body in fake.responses.forwarded)
    assert fake.responses.refused == [] and fake.responses.overflows == []
