"""Every request is logged: new messages once, a request event, the upstream's usage."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.store import BeginResult
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

BEGUN = BeginResult.BEGUN
START = {"type": "compaction/start"}
MODEL = "fake-model"


async def log_of(proxy: RunningProxy, conversation: str) -> list[dict[str, Any]]:
    return await proxy.read_log(conversation)


async def send(
    client: openai.AsyncOpenAI, messages: list[dict[str, Any]], **options: Any
) -> tuple[str, Any]:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, **options
    )
    return raw.headers["x-compaction-conversation"], raw.parse()


async def rewrite_every_turn(
    proxy: RunningProxy, session_id: str, turns: int
) -> tuple[str, list[dict[str, Any]]]:
    """A client that stamps its first message with the time every turn (under a fixed session
    id): the conversation id and the last body sent."""
    history = agent_turns(turns, output="x" * 500)
    conversation, messages = "", []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        for turn in range(turns):
            messages = [user(f"now is 12:00:{turn:02}"), *history[: 2 * turn], user("go on")]
            conversation, _ = await send(
                client, messages, extra_headers={"X-Session-Id": session_id}
            )
    return conversation, messages


async def test_replayed_history_logs_each_message_once(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    history = [system(), user("Fix the parser"), *agent_turns(4)]
    conversation = ""
    for end in range(2, len(history) + 1, 2):
        conversation, _ = await send(client, history[:end])
    events = await log_of(proxy, conversation)
    messages = [e for e in events if e["type"] == "message"]
    assert [e["position"] for e in messages] == list(range(len(history) - 1))
    assert [e["message"] for e in messages] == history[1:]
    requests = [e for e in events if e["type"] == "request"]
    usages = [e for e in events if e["type"] == "usage"]
    assert len(requests) == len(usages) == len(history) // 2
    assert requests[-1]["body_messages"] == len(history) - 1
    assert requests[-1]["generation"] == 0
    assert all(u["prompt_tokens"] > 0 and u["completion_tokens"] == 1 for u in usages)


@pytest.mark.parametrize("include_usage", [True, False])
async def test_streamed_usage_chunk_is_logged(
    proxy: RunningProxy, client: openai.AsyncOpenAI, include_usage: bool
) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[user("stream please")],
        stream=True,
        stream_options={"include_usage": True} if include_usage else None,  # type: ignore[arg-type]
    )
    conversation = raw.headers["x-compaction-conversation"]
    async for _ in raw.parse():
        pass
    usages = [e for e in await log_of(proxy, conversation) if e["type"] == "usage"]
    assert len(usages) == (1 if include_usage else 0)


async def test_log_content_off_keeps_hashes_not_content(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(log_content=False)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as client:
        conversation, _ = await send(client, [user("secret plans"), *agent_turns(1)])
    messages = [e for e in await log_of(proxy, conversation) if e["type"] == "message"]
    assert len(messages) == 3
    assert all("message" not in e and e["hash"] and e["role"] for e in messages)


async def test_a_message_over_the_content_limit_is_logged_without_its_content(
    make_proxy: ProxyFactory,
) -> None:
    proxy = await make_proxy(log_content_max_chars=1_000)
    huge = user("x" * 5_000)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as client:
        conversation, _ = await send(client, [user("small"), *agent_turns(1), huge])
    messages = [e for e in await log_of(proxy, conversation) if e["type"] == "message"]
    assert [("message" in e) for e in messages] == [True, True, True, False]
    assert messages[-1]["digest"] and messages[-1]["hash"] and messages[-1]["role"] == "user"


async def test_two_api_keys_with_one_session_id_never_share_a_log(proxy: RunningProxy) -> None:
    history = [system(), user("same opening"), *agent_turns(3)]
    session = {"X-Session-Id": "shared-run"}
    async with (
        openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-alice", max_retries=0) as alice,
        openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-bob", max_retries=0) as bob,
    ):
        conv_a, _ = await send(alice, history, extra_headers=session)
        await send(alice, [*history, user("alice again")], extra_headers=session)
        conv_b, _ = await send(bob, history, extra_headers=session)
    assert conv_a != conv_b
    log_a, log_b = await log_of(proxy, conv_a), await log_of(proxy, conv_b)
    assert sum(e["type"] == "request" for e in log_a) == 2
    assert sum(e["type"] == "request" for e in log_b) == 1
    assert {e["hash"] for e in log_a if e["type"] == "message"}.isdisjoint(
        e["hash"] for e in log_b if e["type"] == "message"
    )


async def test_checkpoint_reaches_only_its_own_tenant(proxy: RunningProxy, fake: Any) -> None:
    from compaction_proxy.conversation.messages import chain_hashes, chain_root, split_head
    from compaction_proxy.conversation.replacements import Checkpoint
    from compaction_proxy.http.app_keys import SERVICES
    from compaction_proxy.security.tenant import tenant_of

    history = [system(), user("same opening"), *agent_turns(3)]
    session = {"X-Session-Id": "shared-run"}
    secret = await proxy.app[SERVICES].tenant_secret.get()
    root = chain_root(tenant_of(secret, "sk-alice"))
    chain = chain_hashes(root, split_head(history)[1])
    summary = user("<compacted-summary>A</compacted-summary>")
    alice = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-alice", max_retries=0)
    bob = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-bob", max_retries=0)
    conv_a, _ = await send(alice, history, extra_headers=session)
    conv_b, _ = await send(bob, history, extra_headers=session)
    for conv in (conv_a, conv_b):
        record = Checkpoint(0, 4, root, chain[4], summary, 5)  # ends at a tool result
        assert await proxy.store.begin_compaction(conv, "t", 30, START) is BEGUN
        assert await proxy.store.commit_compaction(conv, "t", [], [record])
    fake.received.clear()
    longer = [*history, user("next")]
    raw_a = await alice.chat.completions.with_raw_response.create(
        model=MODEL, messages=longer, extra_headers=session
    )  # type: ignore[arg-type]
    await bob.chat.completions.create(model=MODEL, messages=longer, extra_headers=session)  # type: ignore[arg-type]
    await alice.close()
    await bob.close()
    forwarded_a, forwarded_b = (r.body["messages"] for r in fake.chat_requests)
    assert forwarded_a == [system(), summary, *longer[6:]]
    assert int(raw_a.headers["x-compaction-generation"]) > 0
    # Bob's conversation holds a record made from Alice's chain: it never applies to Bob.
    assert forwarded_b == longer


async def test_no_key_or_content_reaches_the_application_log(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = "sk-very-secret-key-123"
    content = "PLANTED-CONTENT-8472"
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=key, max_retries=0) as client:
        await send(client, [user(content)])
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "wizard", "content": content}]
            )  # type: ignore[misc,list-item]
    assert caplog.records
    assert key not in caplog.text
    assert content not in caplog.text


async def test_a_rewriting_clients_log_grows_linearly_and_still_reads_back(
    make_proxy: Any,
) -> None:
    # A client that rewrites its first message every turn shares no chain hash with its own
    # previous request. Its log grows by what is new each turn (the rewritten message and the
    # new turn), not by its whole body, and its latest request still reads back whole.
    from compaction_proxy.conversation.log_view import latest_request

    proxy = await make_proxy()
    turns = 30
    conversation, messages = await rewrite_every_turn(proxy, "rewriting-client", turns)
    events = await proxy.read_log(conversation)
    logged = [e for e in events if e["type"] == "message"]
    assert len(logged) <= 3 * turns  # linear: about three new contents a turn
    rebuilt = latest_request(events)
    assert rebuilt is not None and rebuilt.body == messages


async def test_a_rewriting_clients_log_stays_within_its_cap(make_proxy: Any) -> None:
    # And whatever a client does, the log is capped.
    proxy = await make_proxy(log_max_events=100)
    conversation, _ = await rewrite_every_turn(proxy, "capped-client", 30)
    log = [(None, event) for event in await proxy.read_log(conversation)]
    assert len(log) <= 100
    assert log[-1][1]["type"] == "usage"  # the newest events are the ones kept


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_huge_first_request_is_logged_whole_in_batches(
    make_proxy: ProxyFactory,
    private_redis: RedisServer,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``LOG_BATCH`` messages the log is written in several store calls (one Redis script
    must not hold the server for a whole huge body), and other clients are served between
    them (the in-process store never waits on I/O, so nothing else would let them); it still
    reads back whole and in order, and the next turn logs only what is new."""
    from compaction_proxy.service.request_log import LOG_BATCH

    store_url = private_redis.url if backend == "redis" else "memory://"
    proxy = await make_proxy(store_url=store_url)
    history = [system(), *(user(f"note {i}") for i in range(2 * LOG_BATCH + 500))]
    ticks = 0  # how often another task ran

    async def another_client() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticks_at_batches: list[int] = []
    append = proxy.store.append

    async def counted_append(*args: Any, **kwargs: Any) -> Any:
        ticks_at_batches.append(ticks)
        return await append(*args, **kwargs)

    monkeypatch.setattr(proxy.store, "append", counted_append)
    ticker = asyncio.create_task(another_client())
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as client:
        conversation, _ = await send(client, history)
        await proxy.app[
            SERVICES
        ].pending_log_writes.settled_all()  # logged with the request's record
        first_batches = list(ticks_at_batches)
        again, _ = await send(
            client, [*history, {"role": "assistant", "content": "ok"}, user("more")]
        )
    ticker.cancel()
    assert len(first_batches) == 2  # before the record, which writes the last batch
    assert first_batches[0] < first_batches[1]
    assert again == conversation
    messages = [e for e in await log_of(proxy, conversation) if e["type"] == "message"]
    assert [e["position"] for e in messages] == list(range(len(history) + 1))
    assert messages[-1]["message"] == user("more")
    state = await proxy.store.load(conversation)
    assert state.logged_tip is not None and state.logged_tip[0] == len(history)
