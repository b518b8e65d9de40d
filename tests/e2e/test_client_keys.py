"""When the proxy holds an upstream key, only holders of a client key may spend it, and each
client key is its own tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from compaction_proxy.config.settings import ConfigError
from compaction_proxy.ops.cli import main
from compaction_proxy.security.client_keys import digest_of
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import route

pytest.importorskip("openai")

import openai

ALICE, BOB = "cpk-alice-0123456789", "cpk-bob-0123456789"
# One of each kind of /v1/ route: chat, Responses, the model list, one relayed unread.
V1_ROUTES = (
    ("/chat/completions", "POST"),
    ("/responses", "POST"),
    ("/models", "GET"),
    ("/embeddings", "POST"),
)


def routes(upstream_url: str) -> list[dict[str, Any]]:
    return [route(upstream_url, "*", api_key_env="UPSTREAM_KEY")]


@pytest.fixture
async def keyed_proxy(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> RunningProxy:
    monkeypatch.setenv("UPSTREAM_KEY", "sk-held-by-the-proxy")
    return await make_proxy(
        routes=routes(upstream_url), client_key_digests=[digest_of(ALICE), digest_of(BOB)]
    )


async def test_a_proxy_holding_an_upstream_key_refuses_to_start_without_client_keys(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "sk-held-by-the-proxy")
    with pytest.raises(ConfigError, match="client-key new"):
        await make_proxy(routes=routes(upstream_url))


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {ALICE}"},
        {"Authorization": "Bearer cpk-not-issued"},
        {"api-key": "cpk-not-issued"},
    ],
)
async def test_clients_without_an_issued_key_get_401(
    keyed_proxy: RunningProxy, fake: FakeUpstream, headers: dict[str, str]
) -> None:
    body = {"model": "m", "messages": [user("spend your key")]}
    async with aiohttp.ClientSession() as http:
        for path, method in V1_ROUTES:
            async with http.request(
                method, f"{keyed_proxy.url}{path}", json=body, headers=headers
            ) as response:
                assert response.status == 401
                error = (await response.json())["error"]
                assert error["code"] == "invalid_api_key" and "param" in error
    assert fake.received == []


async def test_an_issued_key_is_its_own_tenant_and_never_leaves_the_proxy(
    keyed_proxy: RunningProxy, fake: FakeUpstream
) -> None:
    messages = [system(), user("the same opening")]
    conversations = []
    for key in (ALICE, BOB, ALICE):
        async with openai.AsyncOpenAI(base_url=keyed_proxy.url, api_key=key) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
            )
        conversations.append(raw.headers["x-compaction-conversation"])
    assert conversations[0] == conversations[2] != conversations[1]
    for received in fake.received:
        sent = {name.lower(): value for name, value in received.headers.items()}
        assert sent["authorization"] == "Bearer sk-held-by-the-proxy"
        assert ALICE not in str(sent) and BOB not in str(sent)


def test_a_key_issued_by_the_cli_is_accepted_through_a_digest_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from compaction_proxy.config.settings import load_settings
    from compaction_proxy.ops.app import create_app
    from compaction_proxy.security.client_keys import load_client_key_digests

    assert main(["client-key", "new", "--name", "carol"]) == 0
    out = capsys.readouterr().out
    key = out.split("it is not stored): ")[1].split()[0]
    line = out.split("line for client_keys_file: ")[1].strip()
    keys_file = tmp_path / "client-keys"
    keys_file.write_text(f"# issued keys\n{line}\n")
    assert key not in keys_file.read_text()
    settings = load_settings(None, client_keys_file=str(keys_file))
    assert digest_of(key) in load_client_key_digests(settings)
    keys_file.write_text("not-a-digest carol\n")
    with pytest.raises(ConfigError, match="not a SHA-256 hex digest"):
        create_app(load_settings(None, client_keys_file=str(keys_file)))


async def test_a_realtime_session_spends_the_proxys_key_and_never_passes_the_clients(
    keyed_proxy: RunningProxy, fake: FakeUpstream
) -> None:
    offered = ("realtime", f"openai-insecure-api-key.{ALICE}")
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            f"{keyed_proxy.url}/realtime?model=gpt-realtime",
            headers={"Authorization": f"Bearer {ALICE}"},
            protocols=offered,
        ) as ws,
    ):
        assert ws.protocol == "realtime"
        assert (await ws.receive_json())["type"] == "session.created"
    (handshake,) = fake.endpoints.requests
    assert handshake.headers["Authorization"] == "Bearer sk-held-by-the-proxy"
    assert ALICE not in str(handshake.headers)


@pytest.mark.parametrize(("key", "status"), [(ALICE, 101), ("cpk-mallory-0123456789", 401)])
async def test_a_browser_opens_a_realtime_session_with_its_client_key_as_a_subprotocol(
    keyed_proxy: RunningProxy, fake: FakeUpstream, key: str, status: int
) -> None:
    """A browser cannot set ``Authorization`` on a WebSocket: its key comes as a subprotocol,
    is checked as the header would be, and is never offered upstream."""
    offered = ("realtime", f"openai-insecure-api-key.{key}")
    async with aiohttp.ClientSession() as http:
        try:
            async with http.ws_connect(
                f"{keyed_proxy.url}/realtime?model=gpt-realtime", protocols=offered
            ) as ws:
                assert ws.protocol == "realtime"
                assert (await ws.receive_json())["type"] == "session.created"
                answered = 101
        except aiohttp.WSServerHandshakeError as refused:
            answered = refused.status
    assert answered == status
    if status == 101:
        (handshake,) = fake.endpoints.requests
        assert handshake.headers["Authorization"] == "Bearer sk-held-by-the-proxy"
        assert key not in str(handshake.headers)
    else:
        assert fake.endpoints.requests == []
