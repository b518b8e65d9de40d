"""Summarization under pressure end to end: headers, concurrency, failures, a crashed proxy."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from typing import Any

import orjson
import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.security.client_keys import digest_of
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, assistant, system, tool, user
from tests.conftest import ProxyFactory
from tests.helpers import MASKING_OFF, chat, counter, route
from tests.processes import proxy_process
from tests.redis_server import RedisServer, shared_redis_url

pytest.importorskip("openai")

import openai

MODEL = "small-model"
WINDOW = 16_000


def routes(upstream_url: str, **policy: Any) -> list[dict[str, Any]]:
    """Precompaction and masking off: these tests are about the request that summarizes
    (compaction ahead of need has tests/e2e/test_precompaction.py, masking test_masking.py)."""
    return [
        route(upstream_url, "small-*", WINDOW, **{"precompact_ratio": 0, **MASKING_OFF, **policy})
    ]


def history(
    tool_rounds: int = 30, output: str = "importer log line " * 150
) -> list[dict[str, Any]]:
    """About 14k tokens (with the default output): above the 12.8k threshold, inside the 16k
    window."""
    return [
        system(),
        user(f"FACT-5: ticket {uuid.uuid4().hex[:6]}. Make the importer idempotent."),
        *agent_turns(tool_rounds, output=output),
        user("Where are we?"),
    ]


async def ask(url: str, messages: list[dict[str, Any]], key: str = "sk-a") -> Any:
    return await chat(url, messages, MODEL, key)


async def test_pressure_compaction_headers_and_metrics(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url))
    committed = dict(trigger="pressure", mechanism="summary", outcome="committed")
    before = counter("compaction_proxy_compactions_total", **committed)
    summaries = counter("compaction_proxy_summary_duration_seconds_count", result="ok")
    messages = history()
    reply = await ask(proxy.url, messages)
    assert reply.headers["x-compaction-status"] == "compacted"
    generation = reply.headers["x-compaction-generation"]
    assert int(generation) > 0
    assert int(reply.headers["x-compaction-tokens"]) < 0.8 * WINDOW
    assert int(reply.headers["x-compaction-tokens-before"]) >= 0.8 * WINDOW
    assert counter("compaction_proxy_compactions_total", **committed) == before + 1
    assert counter("compaction_proxy_summary_duration_seconds_count", result="ok") == summaries + 1
    saved = counter("compaction_proxy_tokens_saved_total", route="small-*", mechanism="summary")
    assert saved > 0

    again = await ask(proxy.url, [*messages, user("continue")])
    # Every request forwarded through the checkpoint counts what it did not send.
    assert (
        counter("compaction_proxy_tokens_saved_total", route="small-*", mechanism="summary") > saved
    )
    assert again.headers["x-compaction-status"] == "compacted"  # it carries the checkpoint
    assert again.headers["x-compaction-generation"] == generation
    assert len(fake.summary_requests) == 1


async def test_the_summary_call_carries_the_clients_query_string(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url))
    version = {"api-version": "2025-04-01-preview"}
    async with openai.AsyncOpenAI(
        base_url=proxy.url, api_key="sk-a", max_retries=0, default_query=version
    ) as client:
        reply = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
        )
    assert reply.headers["x-compaction-status"] == "compacted"
    assert [r.query for r in fake.summary_requests] == ["api-version=2025-04-01-preview"]
    assert [r.query for r in fake.chat_requests] == ["api-version=2025-04-01-preview"]


CACHE_OPTIONS: dict[str, Any] = {
    "prompt_cache_key": "session-41",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
}
END_USER = {"safety_identifier": "hashed-user-7", "user": "user-7"}


async def test_the_summary_call_reads_the_clients_cache_and_names_its_end_user(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """OpenAI routes a request to a cache by its ``prompt_cache_key``, and attributes what a
    request asks to the end user it names: the summary call of the conversation is made on
    the same terms as the client's own requests."""
    proxy = await make_proxy(routes=routes(upstream_url))
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        reply = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
            **CACHE_OPTIONS,
            **END_USER,
        )
    assert reply.headers["x-compaction-status"] == "compacted"
    (summary,) = fake.summary_requests
    assert summary.body is not None
    assert {k: summary.body.get(k) for k in {**CACHE_OPTIONS, **END_USER}} == {
        **CACHE_OPTIONS,
        **END_USER,
    }


REFUSED_FIELD = orjson.dumps(
    {
        "error": {
            "message": "Unrecognized request argument supplied: prompt_cache_options",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
)
CUT_AT_ITS_CAP = orjson.dumps(
    {
        "id": "chatcmpl-cut",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "## Current Work\nthe"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 12_000, "completion_tokens": 4, "total_tokens": 12_004},
    }
)


@pytest.mark.parametrize(
    ("answer", "calls"),
    [
        # An upstream that refuses a cache option: the call goes again without them.
        ((400, REFUSED_FIELD), [True, False]),
        # A summary cut at its cap would be cut again: no second call.
        ((200, CUT_AT_ITS_CAP), [True]),
    ],
)
async def test_a_chat_summary_call_is_made_again_without_the_clients_options_only_if_refused(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    answer: tuple[int, bytes],
    calls: list[bool],
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url))
    fake.fail_next(*answer)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        await client.chat.completions.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
            **CACHE_OPTIONS,
        )
    made = [r.body for r in fake.summary_requests]
    assert [body is not None and "prompt_cache_key" in body for body in made] == calls


async def test_ten_concurrent_identical_requests_make_one_summary_call(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_delay = 0.3
    proxy = await make_proxy(routes=routes(upstream_url))
    messages = history()
    replies = await asyncio.gather(*(ask(proxy.url, messages) for _ in range(10)))
    assert len(fake.summary_requests) == 1
    assert all(r.parse().choices[0].message.content == "ok" for r in replies)
    forwarded = [r.body["messages"] for r in fake.chat_requests if r.body is not None]
    assert len(forwarded) == 10 and all(f == forwarded[0] for f in forwarded)
    # One made the summary, the others waited for it (or came after it was committed).
    statuses = {r.headers["x-compaction-status"] for r in replies}
    assert "compacted" in statuses and statuses <= {"compacted", "none"}


async def test_failed_summary_never_fails_the_request(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_failures = 1
    proxy = await make_proxy(routes=routes(upstream_url))
    messages = history()
    reply = await ask(proxy.url, messages)
    assert reply.parse().choices[0].message.content == "ok"
    assert reply.headers["x-compaction-status"] == "none"
    assert fake.chat_requests[-1].body is not None
    assert fake.chat_requests[-1].body["messages"] == messages
    # Cooling down: the next request of the same size does not pay for another attempt.
    await ask(proxy.url, messages)
    assert len(fake.summary_requests) == 1


async def test_auto_off_never_summarizes(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url, auto=False))
    reply = await ask(proxy.url, history())
    assert reply.headers["x-compaction-status"] == "none"
    assert fake.summary_requests == []


async def test_summary_model_is_routed_to_its_own_route(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(
        routes=[
            {
                "model": "small-*",
                "base_url": upstream_url,
                "context_window": WINDOW,
                "policy": {
                    "summary_model": "summarizer-model",
                    "precompact_ratio": 0,
                    **MASKING_OFF,
                },
            },
            {"model": "summarizer-model", "base_url": upstream_url, "context_window": 64_000},
        ]
    )
    reply = await ask(proxy.url, history())
    assert reply.headers["x-compaction-status"] == "compacted"
    (summary,) = fake.summary_requests
    assert summary.body is not None and summary.body["model"] == "summarizer-model"
    assert summary.headers["Authorization"] == "Bearer sk-a"


@pytest.mark.slow  # a process, or a latency compared over many requests
async def test_a_proxy_killed_mid_summary_blocks_nothing_once_its_lease_expires(
    fake: FakeUpstream, upstream_url: str
) -> None:
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "crash-test",
        "COMPACTION_PROXY_STORE_URL": shared_redis_url(),
        "COMPACTION_PROXY_LEASE_TTL_SECONDS": "3",
        "COMPACTION_PROXY_SUMMARY_TIMEOUT_SECONDS": "2",
        "COMPACTION_PROXY_ROUTES": orjson.dumps(routes(upstream_url)).decode(),
    }
    messages = history()
    fake.summary_delay = 30
    async with proxy_process(env) as (doomed, base):
        in_flight = asyncio.ensure_future(ask(f"{base}/v1", messages))
        while not fake.summary_requests:
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        doomed.send_signal(signal.SIGKILL)
        await doomed.wait()
        in_flight.cancel()
    fake.summary_delay = 0
    async with proxy_process(env) as (_, base):
        reply = await ask(f"{base}/v1", messages)
        waited = time.monotonic() - killed_at
    assert reply.headers["x-compaction-status"] == "compacted"
    assert waited >= 2.0  # it waited out the dead proxy's lease instead of racing it
    assert len(fake.summary_requests) == 2
    assert fake.chat_requests[-1].body is not None
    assert "<compacted-summary>" in str(fake.chat_requests[-1].body["messages"][1]["content"])


async def test_a_client_rewriting_early_messages_stops_paying_for_summaries(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    stopped = counter("compaction_proxy_proactive_compaction_stopped_total")
    proxy = await make_proxy(routes=routes(upstream_url), checkpoint_miss_limit=3)
    base = history()
    statuses = []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        for turn in range(6):
            rewritten = [
                base[0],
                user(f"[now: 12:00:0{turn}] {base[1]['content']}"),
                *base[2:],
                user(f"turn {turn}"),
            ]
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=rewritten,  # type: ignore[arg-type]
                extra_headers={"X-Session-Id": "rewriting-client"},
            )
            statuses.append(raw.headers["x-compaction-status"])
    assert statuses == ["compacted"] * 3 + ["none"] * 3
    assert len(fake.summary_requests) == 3
    assert counter("compaction_proxy_proactive_compaction_stopped_total") == stopped + 1


async def test_summary_calls_per_tenant_have_a_ceiling(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url), summaries_per_minute_per_tenant=2)
    statuses = [
        (await ask(proxy.url, history(), key="sk-busy")).headers["x-compaction-status"]
        for _ in range(3)
    ]
    assert statuses == ["compacted", "compacted", "none"]
    other = await ask(proxy.url, history(), key="sk-other-tenant")
    assert other.headers["x-compaction-status"] == "compacted"
    assert len(fake.summary_requests) == 3


async def test_a_summary_on_another_host_gets_the_routes_key_and_no_client_headers(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A summary call carries only allow-listed client headers, and the summary route's own
    key. Holding that key, the proxy requires client keys, and never forwards them."""
    summarizer = FakeUpstream()
    elsewhere = str((await aiohttp_server(summarizer.app())).make_url("/v1"))
    monkeypatch.setenv("SUMMARIZER_KEY", "sk-proxy-owned")
    monkeypatch.setenv("MAIN_KEY", "sk-main-route")
    proxy = await make_proxy(
        client_key_digests=[digest_of("cpk-a")],
        routes=[
            {
                "model": "small-*",
                "base_url": upstream_url,
                "api_key_env": "MAIN_KEY",
                "context_window": WINDOW,
                "policy": {
                    "summary_model": "summarizer-model",
                    "precompact_ratio": 0,
                    **MASKING_OFF,
                },
            },
            {"model": "summarizer-model", "base_url": elsewhere, "api_key_env": "SUMMARIZER_KEY"},
        ],
    )
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="cpk-a", max_retries=0) as client:
        reply = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=history(),  # type: ignore[arg-type]
            extra_headers={"X-Trace-Id": "trace-1", "OpenAI-Organization": "org-1"},
            **CACHE_OPTIONS,
            **END_USER,
        )
    assert reply.headers["x-compaction-status"] == "compacted"
    (summary,) = summarizer.summary_requests
    # Another model's cache, another host's API: none of the client's cache options or names.
    assert summary.body is not None and not {*CACHE_OPTIONS, *END_USER} & summary.body.keys()
    assert summary.headers["Authorization"] == "Bearer sk-proxy-owned"
    sent = {name.lower(): value for name, value in summary.headers.items()}
    assert "x-trace-id" not in sent and sent["openai-organization"] == "org-1"
    assert all("cpk-a" not in value for value in sent.values())
    (forwarded,) = [r for r in fake.received if r.path.endswith("/chat/completions")]
    assert forwarded.headers["Authorization"] == "Bearer sk-main-route"
    assert {k.lower(): v for k, v in forwarded.headers.items()}["x-trace-id"] == "trace-1"


async def test_a_checkpoint_is_reused_across_a_dated_prompt_but_not_another_instruction(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Same tenant, same body: a summary written under one system prompt is not sent under
    another instruction; a prompt that differs only by its date reuses it."""
    proxy = await make_proxy(routes=routes(upstream_url))
    body = history()[1:]
    dated = "You are a coding agent. Today is Monday, November 30, 2026."
    first = await ask(proxy.url, [system(dated), *body])
    assert first.headers["x-compaction-status"] == "compacted"
    assert len(fake.summary_requests) == 1

    next_day = await ask(
        proxy.url, [system(dated.replace("Monday, November 30", "Tuesday, December 1")), *body]
    )
    assert (
        next_day.headers["x-compaction-conversation"] == first.headers["x-compaction-conversation"]
    )
    assert len(fake.summary_requests) == 1  # the same checkpoint, no new summary

    other = await ask(proxy.url, [system("You are a travel agent."), *body])
    assert other.headers["x-compaction-conversation"] == first.headers["x-compaction-conversation"]
    assert len(fake.summary_requests) == 2  # summarized afresh under its own instructions
    sent = fake.received[-1].body
    assert sent is not None
    assert sent["messages"][0]["content"] == "You are a travel agent."
    summaries = [m for m in sent["messages"] if "<compacted-summary>" in str(m.get("content"))]
    assert len(summaries) == 1


async def test_with_log_content_off_the_summary_is_kept_only_in_its_record(
    make_proxy: ProxyFactory, upstream_url: str
) -> None:
    """The record must hold the summary text (it is forwarded); the log does not repeat it."""
    proxy = await make_proxy(routes=routes(upstream_url), log_content=False)
    reply = await ask(proxy.url, history())
    assert reply.headers["x-compaction-status"] == "compacted"
    conversation = reply.headers["x-compaction-conversation"]
    events = await proxy.read_log(conversation)
    (summary_event,) = [e for e in events if e["type"] == "compaction/summary"]
    assert summary_event["summary"] is None
    assert all("message" not in e for e in events if e["type"] == "message")
    (record,) = (await proxy.store.load(conversation)).records
    assert "<compacted-summary>" in str(record.message["content"])  # type: ignore[union-attr]


CODEX_COMPACTION = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another "
    "LLM that will resume the task."
)


async def test_an_agents_own_compaction_prepares_nothing_and_is_made_to_fit(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Codex's summarization request between the watermarks starts no background round (the
    history is about to be replaced) and goes as sent; one over the window is made to fit,
    where sent directly it would fail."""
    proxy = await make_proxy(
        routes=[route(upstream_url, "small-*", WINDOW, **MASKING_OFF)]  # precompacting
    )
    own = counter("compaction_proxy_client_compactions_total", route="small-*")
    between = [*history(26)[:-1], user(CODEX_COMPACTION)]
    reply = await ask(proxy.url, between)
    assert 0.7 * WINDOW < int(reply.headers["x-compaction-tokens"]) < 0.8 * WINDOW
    assert reply.headers["x-compaction-status"] == "none"
    assert proxy.app[SERVICES].background.in_flight == 0 and fake.summary_requests == []
    over = [*history(36)[:-1], user(CODEX_COMPACTION)]
    assert fake.prompt_tokens({"messages": over}) > WINDOW
    reply = await ask(proxy.url, over)
    assert reply.headers["x-compaction-status"] in ("pruned", "compacted")
    assert fake.chat_requests[-1].prompt_tokens < WINDOW and fake.overflows == []
    assert fake.chat_requests[-1].body["messages"][-1] == user(CODEX_COMPACTION)
    assert counter("compaction_proxy_client_compactions_total", route="small-*") == own + 2


async def test_a_history_rebuilt_from_the_agents_summary_ends_the_round_for_the_old_one(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """A round is being prepared for a long history when the agent replaces it by its own
    summary (its summarization request went unseen): the round is cancelled, and from then on
    the conversation's compaction is left to the agent."""
    fake.summary_delay = 2.0
    proxy = await make_proxy(
        routes=[route(upstream_url, "small-*", WINDOW, **MASKING_OFF)]  # precompacting
    )
    cancelled = counter(
        "compaction_proxy_precompaction_duration_seconds_count", outcome="cancelled"
    )
    long = history(26)
    first = await ask(proxy.url, long)
    assert first.headers["x-compaction-status"] == "precompacting"
    summary = "Another language model started to solve this problem and produced a summary."
    rebuilt = [*long[:2], user(f"{summary}\nFACT-5 kept."), user("Go on.")]
    again = await ask(proxy.url, rebuilt)
    await proxy.app[SERVICES].background.idle()
    after = counter("compaction_proxy_precompaction_duration_seconds_count", outcome="cancelled")
    assert after == cancelled + 1 and fake.summary_requests != []  # started, then ended
    grown = [*rebuilt, *agent_turns(24, output="importer log line " * 150), user("Next?")]
    later = await ask(proxy.url, grown)
    assert 0.7 * WINDOW < int(later.headers["x-compaction-tokens"]) < 0.8 * WINDOW
    assert later.headers["x-compaction-status"] == "none"  # nothing prepared in the background
    assert again.headers["x-compaction-conversation"] == first.headers["x-compaction-conversation"]


async def test_a_live_turn_that_could_never_fit_is_rescued_and_then_pruned_as_history(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """A 128k-character tool output in an 8k window: sent as it is, refused every time the
    agent retries. Its head and tail go, marked; the agent's next request, where it is
    history, has it pruned as usual."""
    window = 8_000
    fake.windows["tiny-model"] = window
    proxy = await make_proxy(routes=[route(upstream_url, "tiny-*", window, precompact_ratio=0)])
    output = "".join(f"line {i}: " + "x" * 60 + "\n" for i in range(1_900))
    assert len(output) > 128_000
    turn = [
        user("Find the failing test."),
        assistant(None, ("call_0", "bash", '{"command": "pytest -q"}')),
        tool("call_0", output),
    ]
    rescued = counter(
        "compaction_proxy_compactions_total",
        trigger="pressure",
        mechanism="rescue",
        outcome="applied",
    )
    first = await chat(proxy.url, turn, "tiny-model")
    assert first.headers["x-compaction-status"] == "rescued"
    sent = fake.chat_requests[-1]
    assert sent.prompt_tokens < window and fake.overflows == []
    cut = sent.body["messages"][-1]["content"]
    assert (
        "Run a narrower command" in cut
        and cut.startswith("line 0: ")
        and cut.endswith("line 1899: " + "x" * 60 + "\n")
    )
    assert sent.body["messages"][0] == user("Find the failing test.")  # the user's own words
    assert (
        counter(
            "compaction_proxy_compactions_total",
            trigger="pressure",
            mechanism="rescue",
            outcome="applied",
        )
        == rescued + 1
    )
    later = [*turn, assistant("It is test_importer."), user("Fix it.")]
    second = await chat(proxy.url, later, "tiny-model")
    assert second.headers["x-compaction-status"] in ("pruned", "compacted")
    forwarded = fake.chat_requests[-1].body["messages"]
    assert "characters removed by compaction-proxy" in str(forwarded)
    assert fake.overflows == []


async def test_without_rescue_the_live_turn_goes_as_sent_and_the_upstream_refuses_it(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    window = 8_000
    fake.windows["tiny-model"] = window
    policy = {"precompact_ratio": 0, "rescue_live_turn": False}
    proxy = await make_proxy(routes=[route(upstream_url, "tiny-*", window, **policy)])
    turn = [
        user("Find the failing test."),
        assistant(None, ("call_0", "bash", '{"command": "pytest -q"}')),
        tool("call_0", "x" * 128_000),
    ]
    with pytest.raises(openai.BadRequestError):
        await chat(proxy.url, turn, "tiny-model")
    assert fake.overflows


# -- twins: conversations that begin alike, without a session id (one conversation id: the
# first message's), compact side by side: none waits for another's summary, none reads
# another's checkpoint, and each goes on with its own.

TWINS = 5


def twin_history(twin: int) -> list[dict[str, Any]]:
    """The same opening message for every twin; from then on, a history of its own."""
    return [
        system(),
        user("FACT-1: hi. Make the importer idempotent."),
        user(f"FACT-2: twin {twin} keeps its notes in /srv/twin-{twin}."),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
    ]


async def test_twins_compact_at_once_and_each_keeps_its_own_checkpoint(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url))
    histories = [twin_history(twin) for twin in range(TWINS)]
    fake.summary_delay = 0.5
    replies = await asyncio.gather(*(ask(proxy.url, history) for history in histories))
    assert [r.headers["x-compaction-status"] for r in replies] == ["compacted"] * TWINS
    # Every twin's summary call was in flight at once: none waited on another's lease.
    assert fake.most_summaries_at_once == TWINS
    assert len(fake.summary_requests) == TWINS
    assert len({r.headers["x-compaction-conversation"] for r in replies}) == 1

    fake.summary_delay = 0
    for twin, history in enumerate(histories):
        more = [*history, {"role": "assistant", "content": "On it."}, user("And now?")]
        reply = await ask(proxy.url, more)
        assert reply.headers["x-compaction-status"] == "compacted"  # its checkpoint, reused
        sent = str(fake.chat_requests[-1].body)
        assert f"twin {twin} keeps its notes" in sent
        others = [other for other in range(TWINS) if other != twin]
        assert not any(f"twin {other} keeps its notes" in sent for other in others)
    assert len(fake.summary_requests) == TWINS


async def test_with_the_summarizer_down_a_request_over_its_window_goes_cut_to_fit(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Every summary call fails and the history is past the window: the request is not sent to
    a certain overflow. The bridge's cuts (observations to their head and tail, for this
    request alone) bring it within the window; the live turn goes as sent."""
    proxy = await make_proxy(routes=routes(upstream_url))
    fake.windows[MODEL] = WINDOW
    fake.summary_failures = 1_000
    messages = history(output="importer log line " * 300)  # about 27k tokens
    reply = await ask(proxy.url, messages)
    assert reply.status_code == 200
    assert reply.headers["x-compaction-status"] == "pruned"
    assert fake.summary_requests  # it was tried
    sent = fake.chat_requests[-1].body
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW
    assert sent["messages"][-1] == messages[-1]
    assert len(sent["messages"]) == len(messages)  # every message kept, observations cut
    # Nothing was committed: the next request, while the conversation cools down after the
    # failure (no summary is tried), is cut to fit again, from the client's own messages.
    more = [*messages, {"role": "assistant", "content": "On it."}, user("Go on.")]
    tried = len(fake.summary_requests)
    reply = await ask(proxy.url, more)
    assert reply.status_code == 200 and reply.headers["x-compaction-status"] == "pruned"
    assert len(fake.summary_requests) == tried
    sent = fake.chat_requests[-1].body
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW


async def test_without_store_or_fallback_a_request_over_its_window_goes_cut_to_fit(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    """Redis is gone: no checkpoint can be read or made, yet the request carries its whole
    history. Its observations are cut for it alone until it fits; before, it went as sent,
    to the upstream's overflow. A request that fits still goes as it came."""
    proxy = await make_proxy(
        routes=routes(upstream_url), store_url=private_redis.url, store_fallback=False
    )
    fake.windows[MODEL] = WINDOW
    messages = history(output="importer log line " * 300)  # about 27k tokens
    await private_redis.stop()
    reply = await ask(proxy.url, messages)
    assert reply.status_code == 200
    assert reply.headers["x-compaction-status"] == "pruned"
    sent = fake.chat_requests[-1].body
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW
    assert sent["messages"][-1] == messages[-1] and sent["messages"][1] == messages[1]
    assert not fake.summary_requests  # nothing to commit a summary to
    small = [system(), user("hello")]
    reply = await ask(proxy.url, small)
    assert reply.headers["x-compaction-status"] == "bypass"
    assert fake.chat_requests[-1].body == {"model": MODEL, "messages": small}


def breaker_open() -> float:
    return counter("compaction_proxy_summary_breaker_open", summarizer="small-*")


def short_output_turns(count: int) -> list[dict[str, Any]]:
    """An agent whose outputs are short: nothing for the bridge to cut, 28k tokens in all."""
    return [
        system(),
        user(f"FACT-5: ticket {uuid.uuid4().hex[:6]}. Make the importer idempotent."),
        *agent_turns(count, output="importer log line " * 10),
        {"role": "assistant", "content": "Looking at the last step."},
        user("Where are we?"),
    ]


async def test_with_no_summary_the_oldest_turns_are_left_out_for_a_marker_to_fit(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Every summary call fails and no cut of an observation can bring the history within
    its window: the oldest whole turns after the task are left out for this request, a marker
    in their place; the task, the newest turns and the live turn go as sent. Once summaries
    work again, the next request is compacted by a real checkpoint and the marker is gone."""
    proxy = await make_proxy(
        routes=routes(upstream_url),
        failure_cooldown_seconds=0,
        summary_breaker_cooldown_seconds=1,  # the breaker's longest wait: probed again soon
    )
    fake.windows[MODEL] = WINDOW
    fake.summary_failures = 1_000
    messages = short_output_turns(400)
    dropped = counter(
        "compaction_proxy_compactions_total",
        trigger="pressure",
        mechanism="drop",
        outcome="applied",
    )
    reply = await ask(proxy.url, messages)
    assert reply.status_code == 200
    assert reply.headers["x-compaction-status"] == "trimmed"
    sent = fake.chat_requests[-1].body
    # A second tenant sees the outage too: the summarizer's breaker opens for everyone.
    other = await ask(proxy.url, short_output_turns(400), key="sk-b")
    assert other.headers["x-compaction-status"] == "trimmed"
    assert breaker_open() == 1
    assert (
        counter(
            "compaction_proxy_compactions_total",
            trigger="pressure",
            mechanism="drop",
            outcome="applied",
        )
        == dropped + 2  # a request of each tenant
    )
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW
    forwarded = sent["messages"]
    assert forwarded[:2] == messages[:2] and forwarded[-3:] == messages[-3:]
    marker = forwarded[2]
    assert marker["role"] == "user" and "earlier turns" in marker["content"]
    assert forwarded[3]["role"] == "assistant"  # a whole turn: its call, then its result
    kept = forwarded[3:]
    assert kept == messages[len(messages) - len(kept) :]  # the newest turns, whole

    fake.summary_failures = 0
    await asyncio.sleep(1.1)  # the breaker's wait: the next request probes the summarizer
    more = [*messages, {"role": "assistant", "content": "On it."}, user("Go on.")]
    reply = await ask(proxy.url, more)
    assert reply.status_code == 200 and reply.headers["x-compaction-status"] == "compacted"
    assert breaker_open() == 0
    sent = str(fake.chat_requests[-1].body)
    assert "earlier turns" not in sent and "compacted-summary" in sent


async def test_with_no_summary_old_observations_are_masked_before_any_turn_is_left_out(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Every summary call fails and cutting every observation to its head and tail is not
    enough: the oldest observations are cleared to placeholders for this request instead, as
    few as it takes, and every turn of the agent goes (its calls, and the newest outputs
    whole), though masking is off on the route."""
    proxy = await make_proxy(routes=routes(upstream_url), failure_cooldown_seconds=0)
    fake.windows[MODEL] = WINDOW
    fake.summary_failures = 1_000
    messages = history(tool_rounds=100)  # about 47k tokens
    masked = counter(
        "compaction_proxy_compactions_total",
        trigger="pressure",
        mechanism="mask",
        outcome="applied",
    )
    reply = await ask(proxy.url, messages)
    assert reply.status_code == 200 and reply.headers["x-compaction-status"] == "masked"
    sent = fake.chat_requests[-1].body
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW
    forwarded = sent["messages"]
    assert len(forwarded) == len(messages) and forwarded[-4:] == messages[-4:]
    assert [m for m in forwarded if m["role"] == "assistant"] == [
        m for m in messages if m["role"] == "assistant"
    ]
    cleared = [m for m in forwarded if "cleared this output of bash" in str(m["content"])]
    assert 0 < len(cleared) < 97  # the oldest, as few as it takes: not every one
    assert "cleared this output" in forwarded[3]["content"]
    applied = counter(
        "compaction_proxy_compactions_total",
        trigger="pressure",
        mechanism="mask",
        outcome="applied",
    )
    assert applied == masked + 1


async def test_a_persons_conversation_is_never_trimmed_to_fit(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """A person chatting, past the window, with the summarizer down: none of their words is
    left out; the request goes as sent and the client gets the upstream's own overflow."""
    proxy = await make_proxy(routes=routes(upstream_url))
    fake.windows[MODEL] = WINDOW
    fake.summary_failures = 1_000
    messages: list[dict[str, Any]] = [system()]
    for i in range(60):
        messages += [user(f"Paragraph {i}: " + "words of my draft " * 100), assistant("Noted.")]
    messages.append(user("Now rewrite it."))
    with pytest.raises(openai.BadRequestError):
        await ask(proxy.url, messages)
    assert fake.chat_requests[-1].body == {"model": MODEL, "messages": messages}


async def test_without_store_or_fallback_the_oldest_turns_go_when_cuts_are_not_enough(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    """Redis is gone and the history's outputs are too short for any cut to matter: the
    request is still made to fit, from its own messages, by leaving out its oldest turns."""
    proxy = await make_proxy(
        routes=routes(upstream_url), store_url=private_redis.url, store_fallback=False
    )
    fake.windows[MODEL] = WINDOW
    messages = short_output_turns(400)
    await private_redis.stop()
    reply = await ask(proxy.url, messages)
    assert reply.status_code == 200 and reply.headers["x-compaction-status"] == "trimmed"
    sent = fake.chat_requests[-1].body
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW
    assert sent["messages"][:2] == messages[:2] and sent["messages"][-3:] == messages[-3:]
    assert "earlier turns" in sent["messages"][2]["content"]


async def test_without_store_or_fallback_an_overflow_that_states_the_window_is_recovered(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    """No window known and no store: the request goes as it came and overflows. The error
    states the window; the request is relieved from its own history under it and retried once,
    since that changed what goes."""
    unknown_window = [route(upstream_url, "small-*", precompact_ratio=0, **MASKING_OFF)]
    proxy = await make_proxy(
        routes=unknown_window, store_url=private_redis.url, store_fallback=False
    )
    fake.windows[MODEL] = WINDOW
    messages = history(output="importer log line " * 300)  # about 27k tokens
    await private_redis.stop()
    reply = await ask(proxy.url, messages)
    assert reply.status_code == 200 and reply.headers["x-compaction-status"] == "recovered"
    assert len(fake.overflows) == 1 and len(fake.chat_requests) == 2
    sent = fake.chat_requests[-1].body
    assert sent is not None and fake.prompt_tokens(sent) <= WINDOW
    assert sent["messages"][-1] == messages[-1]
