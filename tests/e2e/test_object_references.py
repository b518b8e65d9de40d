"""Under a key the proxy holds, a request that names a stored object anywhere (path segment,
body field, content part, nested) is bound to the account: refused under ``refused``; under
``owned``, served only when the caller owns every object it names, else the API's 404 for that
id, and nothing reaches the upstream. A field read for that decision, given twice in one JSON
object, is a 400."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy.security.tenant import tenant_of
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import ALICE, BOB, alice_and_bob, keyed

pytest.importorskip("anthropic")
pytest.importorskip("openai")

import anthropic
import openai

Call = Callable[[openai.AsyncOpenAI, str], Awaitable[Any]]


def file_part(file_id: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "file", "file": {"file_id": file_id}}]}]


# Each names Alice's file through another field the API reads.
NAMING_CALLS: list[tuple[str, Call]] = [
    (
        "chat file part",
        lambda c, f: c.chat.completions.create(
            model="gpt-4o-mini",
            messages=file_part(f),  # type: ignore[arg-type]
        ),
    ),
    (
        "responses input_file",
        lambda c, f: c.responses.create(
            model="gpt-4o-mini",
            input=[{"role": "user", "content": [{"type": "input_file", "file_id": f}]}],
        ),
    ),
    ("vector store file_ids", lambda c, f: c.vector_stores.create(name="his", file_ids=[f])),
    (
        "batch input_file_id",
        lambda c, f: c.batches.create(
            input_file_id=f, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ),
    (
        "fine-tuning training_file",
        lambda c, f: c.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=f),
    ),
]


@pytest.mark.parametrize(("what", "call"), NAMING_CALLS, ids=[w for w, _ in NAMING_CALLS])
async def test_owned_refuses_a_body_naming_anothers_file_with_the_apis_404(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    what: str,
    call: Call,
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, bob):
        payroll = await alice.files.create(file=io.BytesIO(b"payroll"), purpose="batch")
        with pytest.raises(openai.NotFoundError) as missing:
            await call(bob, payroll.id)
    assert isinstance(missing.value.body, dict) and payroll.id in missing.value.body["message"]
    reached = [
        r for r in fake.endpoints.requests if payroll.id.encode() in r.body + r.path.encode()
    ]
    assert reached == [] and payroll.id not in str(fake.received) + str(fake.responses.received)


async def test_owned_serves_a_body_naming_the_callers_own_file(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, _):
        notes = await alice.files.create(file=io.BytesIO(b"notes"), purpose="batch")
        await alice.chat.completions.create(
            model="gpt-4o-mini",
            messages=file_part(notes.id),  # type: ignore[arg-type]
        )
        store = await alice.vector_stores.create(name="mine", file_ids=[notes.id])
        assert store.file_counts.completed == 1
    assert notes.id in str(fake.received)


async def test_owned_checks_every_id_of_a_nested_path(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """Bob's own vector store does not make Alice's file his: the second id is checked too."""
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, bob):
        payroll = await alice.files.create(file=io.BytesIO(b"payroll"), purpose="batch")
        his = await bob.vector_stores.create(name="his")
        fake.endpoints.vector_stores[his.id].append(payroll.id)  # as if attached upstream
        with pytest.raises(openai.NotFoundError) as missing:
            await bob.vector_stores.files.content(payroll.id, vector_store_id=his.id)
        assert isinstance(missing.value.body, dict) and payroll.id in missing.value.body["message"]
        theirs = await alice.vector_stores.create(name="hers", file_ids=[payroll.id])
        read = await alice.vector_stores.files.content(payroll.id, vector_store_id=theirs.id)
        assert [part.text async for part in read] == ["payroll"]


@pytest.mark.parametrize("path", ["/responses/compact", "/responses/input_tokens"])
async def test_a_stored_response_named_by_compact_or_input_tokens_is_bound_to_the_account(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    path: str,
) -> None:
    refused = await keyed(make_proxy, upstream_url, monkeypatch)
    owned = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    body = {"model": "gpt-4o-mini", "previous_response_id": "resp_of_alice", "input": "x"}
    async with aiohttp.ClientSession() as http:

        async def post(proxy: RunningProxy, key: str, sent: dict[str, Any]) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(proxy.url + path, json=sent, headers=headers) as answer:
                return answer.status, await answer.json()

        status, error = await post(refused, BOB, body)
        assert status == 403 and error["error"]["code"] == "account_endpoint_refused"
        assert error["error"]["param"] == "previous_response_id"
        status, error = await post(owned, BOB, body)
        assert status == 404 and "resp_of_alice" in error["error"]["message"]
        assert fake.endpoints.requests == []
        # Naming nothing, they answer from the request alone, as before.
        stateless = {"model": "gpt-4o-mini", "input": "x"}
        assert (await post(refused, BOB, stateless))[0] == 200
        # In owned mode, Alice's own stored response is hers to compact.
        async with alice_and_bob(owned) as (alice, _):
            mine = await alice.responses.create(model="gpt-4o-mini", input="my salary is 10")
        status, answer = await post(owned, ALICE, {**body, "previous_response_id": mine.id})
        assert status == 200, answer


async def test_refused_mode_refuses_a_chat_naming_a_file(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=BOB, max_retries=0) as bob:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await bob.chat.completions.create(
                model="gpt-4o-mini",
                messages=file_part("file-somebodys"),  # type: ignore[arg-type]
            )
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["code"] == "account_endpoint_refused"
        assert "file-somebodys" in refused.value.body["message"]
        # A chat naming nothing is served as ever.
        await bob.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    assert "file-somebodys" not in str(fake.received)


@pytest.mark.parametrize(
    "block",
    [
        {"type": "document", "source": {"type": "file", "file_id": "file_of_alice"}},
        {"type": "container_upload", "file_id": "file_of_alice"},
    ],
)
async def test_an_anthropic_request_naming_a_file_is_bound_to_the_account(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    block: dict[str, Any],
) -> None:
    monkeypatch.setenv("ANTHROPIC_KEY", "sk-ant-held")
    proxy = await keyed(
        make_proxy,
        upstream_url,
        monkeypatch,
        account_endpoints="owned",
        anthropic_base_url=upstream_url,
        anthropic_api_key_env="ANTHROPIC_KEY",
    )
    async with anthropic.AsyncAnthropic(base_url=proxy.root, api_key=BOB, max_retries=0) as bob:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await bob.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=100,
                messages=[{"role": "user", "content": [block]}],  # type: ignore[list-item]
            )
        with pytest.raises(anthropic.NotFoundError):
            await bob.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=100,
                container="container_of_alice",
                messages=[{"role": "user", "content": "run it"}],
            )
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["type"] == "error" and "file_of_alice" in str(missing.value.body)
    assert fake.messages.received == []


async def test_a_skill_the_account_keeps_binds_the_request_and_anthropics_own_do_not(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """An uploaded skill is the account's instructions and code: mounting one (OpenAI's
    ``skill_reference``, Anthropic's ``custom``) is refused under a held key, and in owned mode
    is a 404 (skills are not made through the proxy, so they are nobody's). Anthropic's own
    skills are no object of the account."""
    monkeypatch.setenv("ANTHROPIC_KEY", "sk-ant-held")
    proxy = await keyed(
        make_proxy,
        upstream_url,
        monkeypatch,
        anthropic_base_url=upstream_url,
        anthropic_api_key_env="ANTHROPIC_KEY",
    )
    mounted = {"type": "skill_reference", "skill_id": "skill_of_the_operator"}
    shell = {"type": "shell", "environment": {"type": "container_auto", "skills": [mounted]}}
    async with alice_and_bob(proxy) as (_, bob):
        with pytest.raises(openai.PermissionDeniedError):
            await bob.responses.create(model="gpt-4o-mini", input="x", tools=[shell])  # type: ignore[list-item]
    async with anthropic.AsyncAnthropic(base_url=proxy.root, api_key=BOB, max_retries=0) as claude:
        custom = {"type": "custom", "skill_id": "skill_of_the_operator", "version": "latest"}
        with pytest.raises(anthropic.PermissionDeniedError):
            await claude.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=100,
                messages=[{"role": "user", "content": "make slides"}],
                extra_body={"container": {"skills": [custom]}},
            )
        own = {"type": "anthropic", "skill_id": "pptx", "version": "latest"}
        await claude.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=100,
            messages=[{"role": "user", "content": "make slides"}],
            extra_body={"container": {"skills": [own]}},
        )
    assert "skill_of_the_operator" not in str(fake.received) + str(fake.responses.received)
    assert "pptx" in str(fake.messages.received)


@pytest.mark.parametrize(
    ("path", "raw", "key"),
    [
        ("/chat/completions", b'{"model":"gpt-4o","messages":[],"model":"gpt-4o-mini"}', "model"),
        (
            "/responses",
            b'{"model":"m","input":"x","previous_response_id":"r1","previous_response_id":"r2"}',
            "previous_response_id",
        ),
        (
            "/batches",
            b'{"input_file_id":"f1","endpoint":"/v1/chat/completions","input_file_id":"f2"}',
            "input_file_id",
        ),
        ("/responses/compact", b'{"model":"m","input":"x","mod\\u0065l":"other"}', "model"),
    ],
)
async def test_a_decision_field_given_twice_in_one_object_is_a_400(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    path: str,
    raw: bytes,
    key: str,
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    headers = {"Authorization": f"Bearer {BOB}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + path, data=raw, headers=headers) as answer:
            assert answer.status == 400
            error = (await answer.json())["error"]
    assert error["code"] == "duplicate_key" and error["param"] == key
    assert fake.endpoints.requests == [] and fake.received == []


async def test_a_reference_in_a_later_turn_of_a_remembered_conversation_is_found(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """A body extending one the proxy remembers is scanned from where they differ: what the
    new turns name is found all the same, and so is a model given twice after them."""
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    history: list[dict[str, Any]] = [{"role": "user", "content": "hello " * 200}]
    async with alice_and_bob(proxy) as (alice, bob):
        payroll = await alice.files.create(file=io.BytesIO(b"payroll"), purpose="batch")
        for turn in range(3):
            await bob.chat.completions.create(model="gpt-4o-mini", messages=history)  # type: ignore[arg-type]
            history += [
                {"role": "assistant", "content": f"turn {turn}"},
                {"role": "user", "content": "more " * 100},
            ]
        with pytest.raises(openai.NotFoundError):
            await bob.chat.completions.create(
                model="gpt-4o-mini",
                messages=[*history, *file_part(payroll.id)],  # type: ignore[arg-type]
            )
    raw = b'{"messages":' + orjson.dumps(history) + b',"model":"gpt-4o-mini","model":"gpt-4o"}'
    headers = {"Authorization": f"Bearer {BOB}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/chat/completions", data=raw, headers=headers) as answer:
            assert answer.status == 400
            assert (await answer.json())["error"]["code"] == "duplicate_key"
    assert payroll.id not in str(fake.received)


async def first_answer_item(client: openai.AsyncOpenAI, text: str, stream: bool) -> str:
    """The id of the message a stored response answers ``text`` with."""
    if not stream:
        made = await client.responses.create(model="gpt-4o-mini", input=text)
        return made.output[0].id
    events = await client.responses.create(model="gpt-4o-mini", input=text, stream=True)
    async for event in events:
        if event.type == "response.completed":
            return event.response.output[0].id
    raise AssertionError("the stream never completed")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_owned_serves_an_item_reference_only_to_the_tenant_whose_answer_it_names(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    stream: bool,
) -> None:
    """The Vercel AI SDK sends each earlier answer as an ``item_reference`` while ``store`` is
    on: the provider reads it as the stored item. Alice's answers are hers to name (claimed
    from the answer, or from a stream's last event); Bob naming one, as an item reference or
    as a stored reasoning item, gets the API's 404 and nothing reaches the upstream."""
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, bob):
        item = await first_answer_item(alice, "The payroll is in vault/7.", stream)
        later = {"role": "user", "content": "Go on."}
        await alice.responses.create(
            model="gpt-4o-mini",
            input=[{"type": "item_reference", "id": item}, later],  # type: ignore[list-item]
        )
        for named in (
            {"type": "item_reference", "id": item},
            {"type": "reasoning", "id": item, "summary": []},
        ):
            with pytest.raises(openai.NotFoundError) as missing:
                await bob.responses.create(model="gpt-4o-mini", input=[named, later])  # type: ignore[list-item]
            assert isinstance(missing.value.body, dict) and item in missing.value.body["message"]
    reached = [body for body in fake.responses.received if item in str(body)]
    assert len(reached) == 1  # Alice's own reference alone


async def test_reasoning_that_carries_its_own_content_names_nothing_stored(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """Codex sends its reasoning back with ``encrypted_content`` and ``store: false``: the
    provider reads the item as sent, so it is served whatever its id."""
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    async with alice_and_bob(proxy) as (_, bob):
        await bob.responses.create(
            model="gpt-4o-mini",
            input=[
                {"role": "user", "content": "Hi."},
                reasoning,
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Go on."},
            ],  # type: ignore[list-item]
            store=False,
        )
    assert "rs_1" in str(fake.responses.received)


@pytest.mark.parametrize(
    ("item", "key"),
    [
        # Read as a message by a parser keeping the last "type", as a reference by one
        # keeping the first.
        (
            b'{"type":"item_reference","type":"message","role":"user","content":"x","id":"m"}',
            "type",
        ),
        (b'{"type":"item_reference","id":"theirs","id":"mine"}', "id"),
        (
            b'{"type":"reasoning","id":"rs_x","summary":[],"encrypted_content":null,'
            b'"encrypted_content":"gAAA"}',
            "encrypted_content",
        ),
    ],
)
async def test_a_field_deciding_what_an_item_names_given_twice_is_a_400(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeUpstream,
    item: bytes,
    key: str,
) -> None:
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    raw = b'{"model":"gpt-4o-mini","input":[' + item + b',{"role":"user","content":"y"}]}'
    headers = {"Authorization": f"Bearer {BOB}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/responses", data=raw, headers=headers) as answer:
            assert answer.status == 400
            error = (await answer.json())["error"]
    assert error["code"] == "duplicate_key" and error["param"] == key
    assert fake.responses.received == []


async def test_a_body_sent_under_another_content_type_is_searched_all_the_same(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """An upstream may read JSON whatever the Content-Type says: under a held key, a body that
    is not a multipart upload is read and searched before it goes."""
    proxy = await keyed(make_proxy, upstream_url, monkeypatch)
    body = b'{"model":"gpt-4o-mini","previous_response_id":"resp_of_alice","input":"x"}'
    headers = {"Authorization": f"Bearer {BOB}", "Content-Type": "text/plain"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/responses/compact", data=body, headers=headers) as got:
            assert got.status == 403
            assert (await got.json())["error"]["code"] == "account_endpoint_refused"
    assert fake.endpoints.requests == []


def form(fields: dict[str, str]) -> tuple[bytes, str]:
    boundary = "f0rm"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    body = "".join(parts) + f"--{boundary}--\r\n"
    return body.encode(), f"multipart/form-data; boundary={boundary}"


async def test_a_form_field_naming_anothers_file_is_refused_in_owned_mode(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, fake: FakeUpstream
) -> None:
    """A container's file may be attached by ``file_id`` in a multipart form: Bob's own
    container does not make Alice's file his."""
    proxy = await keyed(make_proxy, upstream_url, monkeypatch, account_endpoints="owned")
    async with alice_and_bob(proxy) as (alice, _):
        payroll = await alice.files.create(file=io.BytesIO(b"payroll"), purpose="batch")
    await proxy.store.claim_objects(tenant_of(b"t-secret", BOB), ["cntr_bob"], 3600)
    async with aiohttp.ClientSession() as http:

        async def attach(file_id: str) -> int:
            body, content_type = form({"file_id": file_id})
            headers = {"Authorization": f"Bearer {BOB}", "Content-Type": content_type}
            url = proxy.url + "/containers/cntr_bob/files"
            async with http.post(url, data=body, headers=headers) as answer:
                return answer.status

        assert await attach(payroll.id) == 404
        assert not [r for r in fake.endpoints.requests if payroll.id.encode() in r.body]
        # A file nobody's own is refused as well; the container alone is not enough.
        assert await attach("file-of-nobody") == 404
        assert not [r for r in fake.endpoints.requests if "containers" in r.path]
