"""Token pressure on every request, model-free pruning once it crosses the threshold, and what
the provider's cache did with each prompt."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.store import Store
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import assistant, system, tool, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import chat, counter, route

SMALL_WINDOW = 8_000
CACHE_KINDS = ("read", "written", "uncached")


def bulky(seed: str, words: int = 3_300) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(words))


def heavy_history() -> list[dict[str, Any]]:
    tag = uuid.uuid4().hex[:8]
    return [
        system(),
        user(f"Investigate the failing build {tag}"),
        assistant(None, ("c1", "bash", '{"command": "make"}')),
        tool("c1", bulky("make")),
        assistant(None, ("c2", "bash", '{"command": "pytest"}')),
        tool("c2", bulky("test")),
        assistant("Two suites failed."),
        user("What failed?"),  # the live turn
    ]


def routes(upstream_url: str, window: int | None = SMALL_WINDOW, **policy: Any) -> list[Any]:
    return [route(upstream_url, "small-*", window, **policy)]


async def post(proxy: RunningProxy, messages: list[dict[str, Any]], model: str = "small-model"):  # type: ignore[no-untyped-def]
    return await chat(proxy.url, messages, model, "k")


async def events(store: Store, conversation: str) -> list[dict[str, Any]]:
    return [e for _, e in (await store.read_log(conversation, limit=10_000)).events]


async def test_huge_tool_results_are_pruned_once_and_reused(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, store_url: str
) -> None:
    proxy = await make_proxy(store_url=store_url, routes=routes(upstream_url))
    history = heavy_history()
    first = await post(proxy, history)
    assert first.headers["x-compaction-status"] == "pruned"
    generation = first.headers["x-compaction-generation"]
    assert int(generation) > 0
    tokens = int(first.headers["x-compaction-tokens"])
    assert tokens < 0.8 * SMALL_WINDOW < int(first.headers["x-compaction-tokens-before"])
    forwarded = fake.chat_requests[-1].body["messages"]
    for i in (3, 5):
        assert "characters removed by compaction-proxy" in forwarded[i]["content"]
        assert forwarded[i]["content"].startswith(history[i]["content"][:4096])
        assert {k: v for k, v in forwarded[i].items() if k != "content"} == {
            k: v for k, v in history[i].items() if k != "content"
        }
    assert forwarded[:3] == history[:3] and forwarded[4] == history[4]
    assert forwarded[6:] == history[6:]

    # The next turn, on another replica when the store is shared (or after a restart).
    if store_url != "memory://":
        await proxy.server.close()
        proxy = await make_proxy(store_url=store_url, routes=routes(upstream_url))
    later = [*history, assistant("The tests failed."), user("Fix them.")]
    second = await post(proxy, later)
    assert second.headers["x-compaction-status"] == "pruned"  # the same prunes, reused
    assert second.headers["x-compaction-generation"] == generation
    again = fake.chat_requests[-1].body["messages"]
    assert again[: len(forwarded)] == forwarded
    conversation = second.headers["x-compaction-conversation"]
    log = await events(proxy.store, conversation)
    assert [e["type"] for e in log].count("compaction/start") == 1
    assert [e["position"] for e in log if e["type"] == "prune"] == [2, 4]


async def test_below_the_threshold_nothing_is_pruned(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url, window=100_000))
    history = heavy_history()
    reply = await post(proxy, history)
    assert reply.headers["x-compaction-status"] == "none"
    assert "x-compaction-tokens-before" not in reply.headers
    assert fake.chat_requests[-1].body["messages"] == history
    assert (await proxy.store.load(reply.headers["x-compaction-conversation"])).records == ()


async def test_auto_off_never_prunes(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url, auto=False))
    history = heavy_history()
    reply = await post(proxy, history)
    assert reply.headers["x-compaction-status"] == "none"
    assert fake.chat_requests[-1].body["messages"] == history


async def test_unknown_window_means_no_proactive_pressure(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url, window=None))
    history = heavy_history()
    reply = await post(proxy, history, model="small-unknown-model")
    assert reply.headers["x-compaction-status"] == "none"
    assert int(reply.headers["x-compaction-tokens"]) > SMALL_WINDOW
    assert fake.chat_requests[-1].body["messages"] == history


async def test_stated_limit_of_an_overflow_teaches_the_window(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows["small-unknown-model"] = SMALL_WINDOW
    proxy = await make_proxy(routes=routes(upstream_url, window=None))
    history = heavy_history()
    bigger = [
        *history[:-1],
        assistant(None, ("c3", "bash", "{}")),
        tool("c3", bulky("more")),
        assistant("A third one failed."),
        user("And?"),
    ]
    first = await post(proxy, bigger, model="small-unknown-model")
    assert first.headers["x-compaction-status"] == "recovered"
    assert len(fake.overflows) == 1
    # Another conversation of the same model is now measured against the learned window.
    reply = await post(proxy, heavy_history(), model="small-unknown-model")
    assert reply.headers["x-compaction-status"] == "pruned"
    assert len(fake.overflows) == 1


async def test_anchor_from_usage_measures_the_next_request(
    make_proxy: ProxyFactory, fake: FakeUpstream
) -> None:
    fake.encoding_name = "cl100k_base"  # the upstream counts differently from the meter
    proxy = await make_proxy()
    history = [system(), user("Explain the design " * 40), assistant("It is layered. " * 30)]
    await post(proxy, history, model="fake-model")
    upstream_count = fake.chat_requests[-1].prompt_tokens
    later = [*history, user("Go on.")]
    reply = await post(proxy, later, model="fake-model")
    log = await events(proxy.store, reply.headers["x-compaction-conversation"])
    requests = [e for e in log if e["type"] == "request"]
    assert [r["anchored"] for r in requests] == [False, True]
    anchored_estimate = requests[1]["estimated_tokens"]
    assert int(reply.headers["x-compaction-tokens"]) == anchored_estimate
    exact = fake.chat_requests[-1].prompt_tokens
    assert upstream_count < anchored_estimate
    assert abs(anchored_estimate - exact) <= abs(requests[0]["estimated_tokens"] - upstream_count)


async def test_what_the_providers_cache_did_with_each_prompt_is_counted_by_route(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """An operator sees in the metrics whether prompts are read from the provider's cache or
    written to it again: the usage the upstream reports, split by route."""
    proxy = await make_proxy(routes=routes(upstream_url, None))
    cache = "compaction_proxy_upstream_prompt_tokens_total"
    before = {kind: counter(cache, route="small-*", cache=kind) for kind in CACHE_KINDS}
    usage = {
        "prompt_tokens": 3_000,
        "completion_tokens": 4,
        "total_tokens": 3_004,
        "prompt_tokens_details": {"cached_tokens": 2_048, "cache_write_tokens": 900},
    }
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "small-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": usage,
    }
    fake.fail_next(200, orjson.dumps(answer))
    reply = await post(proxy, [user(f"hello {uuid.uuid4().hex[:6]}")])
    assert reply.parse().usage.prompt_tokens == 3_000
    await proxy.app[SERVICES].pending_log_writes.settled_all()  # counted after the answer
    counted = {
        kind: counter(cache, route="small-*", cache=kind) - before[kind] for kind in CACHE_KINDS
    }
    assert counted == {"read": 2_048, "written": 900, "uncached": 52}
