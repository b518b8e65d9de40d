"""When the proxy holds the upstream key, no client reaches what the shared account keeps:
one client key could otherwise list, read and delete another's files, stored completions and
responses. Stateless endpoints are served; a single-team deployment can share the account."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import ALICE, BOB, alice_and_bob, keyed

pytest.importorskip("openai")

import openai

Call = Callable[[openai.AsyncOpenAI], Awaitable[Any]]

ACCOUNT_CALLS: list[tuple[str, Call]] = [
    ("upload a file", lambda c: c.files.create(file=io.BytesIO(b"payroll"), purpose="batch")),
    ("list files", lambda c: c.files.list()),
    ("read a file", lambda c: c.files.content("file-of-alice")),
    ("delete a file", lambda c: c.files.delete("file-of-alice")),
    ("list stored completions", lambda c: c.chat.completions.list()),
    ("read a stored completion", lambda c: c.chat.completions.messages.list("chatcmpl-1")),
    ("read a stored response", lambda c: c.responses.retrieve("resp_of_alice")),
    ("list batches", lambda c: c.batches.list()),
    ("list vector stores", lambda c: c.vector_stores.list()),
    (
        "continue a stored response",
        lambda c: c.responses.create(
            model="gpt-4o-mini", input="and then?", previous_response_id="resp_of_alice"
        ),
    ),
]


@pytest.mark.parametrize(("what", "call"), ACCOUNT_CALLS, ids=[w for w, _ in ACCOUNT_CALLS])
async def test_account_endpoints_are_refused_under_a_held_key_naming_the_setting(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    what: str,
    call: Call,
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=BOB, max_retries=0) as bob:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await call(bob)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "account_endpoint_refused"
    assert "account_endpoints: shared" in error["message"]
    assert fake.endpoints.requests == [] and fake.responses.received == []


async def test_stateless_endpoints_are_served_under_a_held_key(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=BOB, max_retries=0) as bob:
        embedded = await bob.embeddings.create(model="text-embedding-3-small", input="x")
        assert embedded.data
        assert (await bob.models.retrieve("gpt-4o-mini")).id == "gpt-4o-mini"
        speech = await bob.audio.speech.create(model="tts-1", voice="alloy", input="hi")
        assert speech.content


async def test_a_route_that_shares_its_account_relays_account_endpoints(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="shared")
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=ALICE, max_retries=0) as alice:
        uploaded = await alice.files.create(file=io.BytesIO(b"team notes"), purpose="batch")
        assert (await alice.files.content(uploaded.id)).content == b"team notes"


async def test_without_a_held_key_each_client_reaches_its_own_account_as_before(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-own", max_retries=0) as own:
        uploaded = await own.files.create(file=io.BytesIO(b"mine"), purpose="batch")
        assert (await own.files.content(uploaded.id)).content == b"mine"


async def test_owned_keeps_each_client_keys_files_its_own(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, bob):
        payroll = await alice.files.create(file=io.BytesIO(b"payroll"), purpose="batch")
        notes = await bob.files.create(file=io.BytesIO(b"bob's notes"), purpose="batch")
        # Each lists, reads and deletes its own ...
        assert [f.id for f in (await alice.files.list()).data] == [payroll.id]
        assert [f.id for f in (await bob.files.list()).data] == [notes.id]
        assert (await alice.files.retrieve(payroll.id)).filename == payroll.filename
        assert (await alice.files.content(payroll.id)).content == b"payroll"
        # ... and the other's does not exist for it: not read, not deleted, not even seen.
        for call in (bob.files.retrieve, bob.files.content, bob.files.delete):
            with pytest.raises(openai.NotFoundError) as missing:
                await call(payroll.id)
            assert isinstance(missing.value.body, dict)
            assert payroll.id in missing.value.body["message"]
        assert payroll.id in fake.endpoints.files
        assert (await alice.files.delete(payroll.id)).deleted
    # The refused requests never reached the upstream.
    reads = [r.path for r in fake.endpoints.requests if payroll.id in r.path]
    alices = ["", "/content", ""]  # her retrieve, read and delete
    assert reads == [f"/v1/files/{payroll.id}{tail}" for tail in alices]


async def test_owned_gives_a_batch_owner_its_output_file(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, bob):
        requests = await alice.files.create(file=io.BytesIO(b"{}"), purpose="batch")
        batch = await alice.batches.create(
            input_file_id=requests.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with pytest.raises(openai.NotFoundError):
            await bob.batches.retrieve(batch.id)
        done = await alice.batches.retrieve(batch.id)
        assert done.output_file_id is not None
        assert b"batch_req_1" in (await alice.files.content(done.output_file_id)).content
        with pytest.raises(openai.NotFoundError):
            await bob.files.content(done.output_file_id)


async def test_owned_continues_only_the_callers_own_stored_responses(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, bob):
        first = await alice.responses.create(model="gpt-4o-mini", input="my salary is 10")
        # A stream's response is Alice's from its first event, before she has read it all.
        streamed = await alice.responses.create(model="gpt-4o-mini", input="hi", stream=True)
        async for event in streamed:
            if event.type == "response.created":
                created = event.response.id
                break
        for previous in (first.id, created):
            later = await alice.responses.create(
                model="gpt-4o-mini", input="and then?", previous_response_id=previous
            )
            assert later.previous_response_id == previous
            chained = await alice.responses.create(
                model="gpt-4o-mini", input="more", previous_response_id=later.id
            )
            assert chained.previous_response_id == later.id
            with pytest.raises(openai.NotFoundError) as missing:
                await bob.responses.create(
                    model="gpt-4o-mini", input="and then?", previous_response_id=previous
                )
            assert isinstance(missing.value.body, dict)
            assert missing.value.body["param"] == "previous_response_id"
    stateful = [r for r in fake.responses.received if r.get("previous_response_id")]
    assert len(stateful) == 4  # Bob's never went upstream


@pytest.mark.parametrize("held", [False, True], ids=["own key", "held key"])
async def test_claude_codes_cache_keepalive_is_relayed_and_refused_under_a_held_key(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    held: bool,
) -> None:
    """``/v1/messages/cache_touch`` names a request of the account by its id: relayed with the
    client's own key, refused under the proxy's (Claude Code then stops touching)."""
    if held:
        proxy = await keyed(make_proxy, upstream_url, monkeypatch)
    else:
        proxy = await make_proxy(anthropic_base_url=upstream_url)
    headers = {"x-api-key": BOB if held else "sk-ant-own", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as http:
        url = proxy.root + "/v1/messages/cache_touch"
        async with http.post(url, json={"request_id": "req_of_alice"}, headers=headers) as got:
            status, answer = got.status, await got.read()
    if held:
        assert status == 403 and orjson.loads(answer)["error"]["type"] == "permission_error"
        assert fake.messages.touched == []
    else:
        assert status == 200 and fake.messages.touched == ["req_of_alice"]
