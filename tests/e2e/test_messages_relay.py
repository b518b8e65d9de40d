"""Anthropic-format clients (Claude Code, the anthropic SDK) through the proxy: ``/v1/messages``
routed by model, credentials as Anthropic takes them, never another tenant's or a client key;
the model list and message batches from the Anthropic upstream, the proxy's own errors in
Anthropic's shape. (Compaction of Messages requests: ``test_messages_compaction``.)"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy.security.client_keys import digest_of
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import route
from tests.processes import free_port

pytest.importorskip("anthropic")

import anthropic

CLAUDE = "claude-sonnet-4-5"
CLIENT_KEY = "cpk-claude-0123456789"
OTHER_CLIENT_KEY = "cpk-other-0123456789"


def messages(
    proxy: RunningProxy, api_key: str, header: str = "x-api-key"
) -> anthropic.AsyncAnthropic:
    """An SDK client sending ``api_key`` in ``header``: ``x-api-key`` as Claude Code does with
    an API key, or ``authorization`` (a bearer token, as for OAuth)."""
    base = proxy.url.removesuffix("/v1")  # the SDK adds /v1/messages itself
    if header == "authorization":
        return anthropic.AsyncAnthropic(base_url=base, auth_token=api_key, max_retries=0)
    return anthropic.AsyncAnthropic(
        base_url=base, api_key=None, default_headers={"x-api-key": api_key}, max_retries=0
    )


async def holding_a_key(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    **settings: Any,
) -> RunningProxy:
    """A proxy whose ``claude-*`` route holds the upstream key, and one client key."""
    monkeypatch.setenv("ANTHROPIC_ROUTE_KEY", "sk-ant-held")
    settings.setdefault("client_key_digests", [digest_of(CLIENT_KEY)])
    return await make_proxy(
        routes=[route(upstream_url, "claude-*", api_key_env="ANTHROPIC_ROUTE_KEY")], **settings
    )


async def ask(client: anthropic.AsyncAnthropic, **extra: Any) -> str:
    reply = await client.messages.create(
        model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}], **extra
    )
    block = reply.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    return block.text


@pytest.mark.parametrize("header", ["x-api-key", "authorization"])
async def test_a_routes_key_goes_as_x_api_key_and_the_clients_own_key_never(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    header: str,
) -> None:
    proxy = await holding_a_key(make_proxy, upstream_url, monkeypatch)
    async with messages(proxy, CLIENT_KEY, header) as client:
        assert await ask(client) == "Done."
        async with client.messages.stream(
            model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert await stream.get_final_text() == "Done."
        counted = await client.messages.count_tokens(
            model=CLAUDE, messages=[{"role": "user", "content": "hi"}]
        )
        assert counted.input_tokens > 0
    assert len(fake.messages.received) == 3
    for received in fake.messages.received:
        headers = {name.lower(): value for name, value in received.headers.items()}
        assert headers["x-api-key"] == "sk-ant-held"
        assert "authorization" not in headers
        assert CLIENT_KEY not in str(headers)
        assert headers["anthropic-version"]  # the client's own headers go on


async def test_a_client_key_sent_as_x_api_key_is_checked_like_a_bearer_token(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    proxy = await holding_a_key(make_proxy, upstream_url, monkeypatch)
    async with messages(proxy, "cpk-not-a-key-of-ours") as stranger:
        with pytest.raises(anthropic.AuthenticationError):
            await ask(stranger)
    assert fake.messages.received == []


async def test_a_model_no_route_names_goes_to_the_anthropic_base_url_with_the_callers_key(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(
        upstream_base_url="http://127.0.0.1:9/v1",  # nothing listens: it must not be asked
        anthropic_base_url=upstream_url,
    )
    async with messages(proxy, "sk-ant-own") as client:
        assert await ask(client) == "Done."
    (received,) = fake.messages.received
    headers = {name.lower(): value for name, value in received.headers.items()}
    assert headers["x-api-key"] == "sk-ant-own"


async def test_the_default_routes_openai_key_never_goes_to_anthropic(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """The default route is the OpenAI-format upstream, and its key is for that upstream
    alone: a Messages request of no route goes to ``anthropic_base_url`` without it (nor the
    client key), and Anthropic's refusal comes back as it is."""
    monkeypatch.setenv("OPENAI_ROUTE_KEY", "sk-openai-held")
    proxy = await make_proxy(
        upstream_base_url="http://127.0.0.1:9/v1",
        upstream_api_key_env="OPENAI_ROUTE_KEY",
        client_key_digests=[digest_of(CLIENT_KEY)],
        anthropic_base_url=upstream_url,
    )
    async with messages(proxy, CLIENT_KEY) as client:
        with pytest.raises(anthropic.AuthenticationError):
            await ask(client)
    assert fake.messages.received == []  # refused for want of a key, as Anthropic would


async def test_message_batches_stay_an_account_endpoint_under_a_held_key(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    proxy = await holding_a_key(
        make_proxy, upstream_url, monkeypatch, anthropic_base_url=upstream_url
    )
    async with messages(proxy, CLIENT_KEY) as client:
        with pytest.raises(anthropic.PermissionDeniedError):
            await client.messages.batches.list()


async def test_the_proxys_own_refusals_come_in_anthropics_error_shape(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await holding_a_key(
        make_proxy, upstream_url, monkeypatch, anthropic_base_url=upstream_url
    )
    async with messages(proxy, "cpk-not-a-key-of-ours") as stranger:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await ask(stranger)
    async with messages(proxy, CLIENT_KEY) as client:
        with pytest.raises(anthropic.PermissionDeniedError) as account:
            await client.messages.batches.list()
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model=CLAUDE, max_tokens=8, messages="not a list")  # type: ignore[arg-type]
    for error, kind in (
        (refused, "authentication_error"),
        (account, "permission_error"),
        (bad, "invalid_request_error"),
    ):
        body = error.value.body
        assert isinstance(body, dict)
        assert body["type"] == "error"
        assert body["error"]["type"] == kind
        assert body["error"]["message"]


async def test_an_anthropic_clients_model_list_comes_from_the_anthropic_upstream(
    make_proxy: ProxyFactory, upstream_url: str
) -> None:
    proxy = await make_proxy(
        upstream_base_url="http://127.0.0.1:9/v1",  # nothing listens: it must not be asked
        anthropic_base_url=upstream_url,
    )
    async with messages(proxy, "sk-ant-own") as client:
        listed = [model async for model in client.models.list()]
    assert "fake-model" in [model.id for model in listed]
    assert {model.type for model in listed} == {"model"}


async def test_owned_keeps_each_client_keys_message_batches_its_own(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await holding_a_key(
        make_proxy,
        upstream_url,
        monkeypatch,
        anthropic_base_url=upstream_url,
        anthropic_api_key_env="ANTHROPIC_ROUTE_KEY",
        account_endpoints="owned",
        client_key_digests=[digest_of(CLIENT_KEY), digest_of(OTHER_CLIENT_KEY)],
    )
    request = {
        "custom_id": "0",
        "params": {
            "model": CLAUDE,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        },
    }
    async with messages(proxy, CLIENT_KEY) as mine, messages(proxy, OTHER_CLIENT_KEY) as other:
        batch = await mine.messages.batches.create(requests=[request])  # type: ignore[list-item]
        theirs = await other.messages.batches.create(requests=[request])  # type: ignore[list-item]
        assert [b.id async for b in mine.messages.batches.list()] == [batch.id]
        assert [b.id async for b in other.messages.batches.list()] == [theirs.id]
        assert (await mine.messages.batches.retrieve(batch.id)).id == batch.id
        for call in (other.messages.batches.retrieve, other.messages.batches.results):
            with pytest.raises(anthropic.NotFoundError) as missing:
                await call(batch.id)
            assert isinstance(missing.value.body, dict)
            assert missing.value.body["error"]["type"] == "not_found_error"


async def test_a_stream_is_relayed_event_by_event_with_its_pings_and_its_error(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """An error inside a stream (``overloaded_error``) reaches the client as sent, after the
    events before it, ``event:`` lines and ``ping`` included."""
    proxy = await make_proxy(routes=[route(upstream_url, "claude-*")])
    overloaded = {"type": "overloaded_error", "message": "Overloaded"}
    fake.messages.stream_error = overloaded
    body = {
        "model": CLAUDE,
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"x-api-key": "sk-ant-own", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/messages", json=body, headers=headers) as reply:
            assert reply.status == 200
            relayed = (await reply.read()).decode()
    events = [block for block in relayed.split("\n\n") if block]
    names = [block.split("\n")[0] for block in events]
    assert names == [
        "event: message_start",
        "event: ping",
        "event: content_block_start",
        "event: content_block_delta",
        "event: content_block_stop",
        "event: error",
    ]
    assert orjson.loads(events[-1].split("data: ", 1)[1]) == {"type": "error", "error": overloaded}
    async with messages(proxy, "sk-ant-own") as client:  # the SDK raises it as Anthropic's
        with pytest.raises(anthropic.APIStatusError) as raised:
            async with client.messages.stream(
                model=CLAUDE, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                await stream.get_final_text()
        assert "overloaded_error" in str(raised.value)


@pytest.mark.parametrize(("fallback", "status"), [(True, "none"), (False, "bypass")])
async def test_a_store_that_is_down_forwards_a_messages_request_as_sent(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, fallback: bool, status: str
) -> None:
    """Its bytes as they came, whether the process's own copy carries the conversation (the
    fallback) or the request goes around the store (``bypass``)."""
    nothing_listens = f"redis://127.0.0.1:{free_port()}"
    proxy = await make_proxy(
        routes=[route(upstream_url, "claude-*")],
        store_url=nothing_listens,
        store_fallback=fallback,
    )
    raw = (  # its odd spacing goes as it came
        b'{"model": "claude-sonnet-4-5",  "max_tokens": 8,'
        b' "messages": [{"role": "user", "content": "hi"}]}'
    )
    headers = {"x-api-key": "sk-ant-own", "content-type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/messages", data=raw, headers=headers) as reply:
            assert reply.status == 200
            assert reply.headers["X-Compaction-Status"] == status
            assert (await reply.json())["content"][0]["text"] == "Done."
    assert fake.messages.received[-1].body == orjson.loads(raw)
