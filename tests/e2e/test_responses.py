"""The Responses API through the proxy, with the real openai SDK: compacted like chat (sync,
async and streamed), pairing and reasoning items kept, overflows recovered, and stateful
requests passed on as sent."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import REGISTRY

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.encodings import compressed
from tests.helpers import MASKING_OFF, counter, route

pytest.importorskip("openai")

import openai

MODEL = "resp-small"
WINDOW = 16_000
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer"}},
            "required": ["step"],
        },
    }
]
CUT = "removed by compaction-proxy"  # the marker of a cut observation
OPENING = "FACT-1: the release branch is release-7. Fix the flaky importer test."


def routes(upstream_url: str, window: int | None = WINDOW) -> list[dict[str, Any]]:
    # Synchronous compaction: the tests read what the request that crossed was sent.
    return [route(upstream_url, "resp-*", window or None, precompact_ratio=0, **MASKING_OFF)]


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream) -> RunningProxy:
    fake.windows[MODEL] = WINDOW
    fake.responses.tool_rounds = 1_000  # the agent loops call tools for as long as they run
    return await make_proxy(routes=routes(upstream_url))


def observation(step: int) -> str:
    return f"step {step} output: " + "importer log line with details " * 220


def read_file_round(step: int, call_id: str | None = None) -> list[dict[str, Any]]:
    """One tool round as Responses items: a ``read_file`` call and its output."""
    call_id = call_id or f"call_{step}"
    return [
        {"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": observation(step)},
    ]


def as_input(item: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = item.model_dump(exclude_none=True)
    return dumped


def next_request(items: list[Any], output: list[Any]) -> list[Any]:
    """The agent's next input: what it sent, the call it got, the call's (large) output."""
    (call,) = output
    assert call.type == "function_call"
    result = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": observation(len(items)),
    }
    return [*items, as_input(call), result]


REQUEST: dict[str, Any] = {"model": MODEL, "instructions": "You are a careful coding agent."}


async def agent_loop(
    client: openai.AsyncOpenAI, turns: int, session: str, stream: bool = False
) -> list[Any]:
    """Drive the fake's tool calls for ``turns`` turns (each answer streamed, if ``stream``);
    returns the input of the last request."""
    items: list[Any] = [{"role": "user", "content": OPENING}]
    headers = {"X-Session-Id": session}
    for turn in range(turns):
        if stream:
            events = await client.responses.create(
                **REQUEST, input=items, tools=TOOLS, extra_headers=headers, stream=True
            )
            completed = [e async for e in events if e.type == "response.completed"]
            output = completed[-1].response.output
        else:
            response = await client.responses.create(
                **REQUEST, input=items, tools=TOOLS, extra_headers=headers
            )
            output = response.output
        if turn < turns - 1:
            items = next_request(items, output)
    return items


def agent_loop_in_sync(base_url: str, turns: int, session: str) -> list[Any]:
    """The same loop with the synchronous client (run it in a thread)."""
    items: list[Any] = [{"role": "user", "content": OPENING}]
    with openai.OpenAI(base_url=base_url, api_key="sk-r", max_retries=0) as client:
        for turn in range(turns):
            response = client.responses.create(
                **REQUEST, input=items, tools=TOOLS, extra_headers={"X-Session-Id": session}
            )
            if turn < turns - 1:
                items = next_request(items, response.output)
    return items


def forwarded_inputs(fake: FakeUpstream) -> list[list[Any]]:
    return [body["input"] for body in fake.responses.forwarded]


def assert_compacted_keeping_what_matters(fake: FakeUpstream, last_sent: list[Any]) -> None:
    assert fake.summary_requests, "a 16k window must have been compacted"
    last = forwarded_inputs(fake)[-1]
    # The checkpoint stands first, as a user message, and keeps the facts.
    assert last[0]["role"] == "user" and "<compacted-summary>" in last[0]["content"]
    assert "FACT-1" in last[0]["content"]
    # The live turn (the last call and its output) reached the upstream exactly as sent.
    assert last[-2:] == last_sent[-2:]
    # Every call kept its output (the fake refuses anything else); instructions as sent.
    assert fake.responses.forwarded[-1]["instructions"] == REQUEST["instructions"]


async def test_a_long_agent_loop_is_compacted_with_pairs_and_facts_kept(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        last_sent = await agent_loop(client, 14, "loop")
    assert_compacted_keeping_what_matters(fake, last_sent)


async def test_a_streamed_agent_loop_is_compacted_the_same(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        last_sent = await agent_loop(client, 14, "streamed-loop", stream=True)
    assert_compacted_keeping_what_matters(fake, last_sent)
    assert all(body.get("stream") for body in fake.responses.forwarded)


async def test_the_sync_client_is_served_the_same(proxy: RunningProxy, fake: FakeUpstream) -> None:
    last_sent = await asyncio.to_thread(agent_loop_in_sync, proxy.url, 14, "sync-loop")
    assert_compacted_keeping_what_matters(fake, last_sent)


async def test_a_streamed_response_is_relayed_and_its_usage_anchors_the_meter(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        raw = await client.responses.with_raw_response.create(
            model=MODEL,
            input=[{"role": "user", "content": "Summarize the plan."}],
            stream=True,
            extra_headers={"X-Session-Id": "streamed"},
        )
        conversation = raw.headers["x-compaction-conversation"]
        kinds, text, usage = [], "", None
        async for event in raw.parse():
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                usage = event.response.usage
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert text == "Done (1 items read)." and usage is not None
    await proxy.app[SERVICES].pending_log_writes.settled_all()
    state = await proxy.store.load(conversation)
    assert state.anchor is not None and state.anchor.prompt_tokens == usage.input_tokens


async def test_reasoning_items_stay_with_their_call_and_reach_only_their_own_model(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    secret = "gAAAAB-encrypted-reasoning-"
    items: list[Any] = [{"role": "user", "content": OPENING}]
    for step in range(12):
        items += [
            {
                "type": "reasoning",
                "id": f"rs_{step}",
                "summary": [],
                "encrypted_content": f"{secret}{step}",
            },
            *read_file_round(step),
        ]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        await client.responses.create(model=MODEL, input=items, tools=TOOLS)
    assert fake.summary_requests
    sent = forwarded_inputs(fake)[-1]
    for index, item in enumerate(sent):
        if item.get("type") == "reasoning":
            assert sent[index + 1]["type"] == "function_call"
            assert sent[index + 1]["call_id"] == "call_" + item["id"].removeprefix("rs_")
    for summary in fake.summary_requests:
        assert summary.body is not None
        if summary.path.endswith("/chat/completions"):  # rebuilt: the proxy cannot read them
            assert secret not in str(summary.body)
            continue
        # The cache-safe call, to the model that wrote them: the items exactly as sent, each
        # reasoning item still before its call, then the instruction.
        prefix = summary.body["input"][:-1]
        assert prefix == items[: len(prefix)] and prefix[-1].get("type") != "reasoning"


async def test_the_cache_safe_call_reads_the_clients_cache_and_names_its_end_user(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """The call that starts as the conversation's next request would goes to the same cache
    (``prompt_cache_key``, where breakpoints go and how long they last) and names the same
    end user (``safety_identifier``, ``user``) as the client's own requests."""
    options: dict[str, Any] = {
        "prompt_cache_key": "thread-9",
        "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
        "safety_identifier": "hashed-user-3",
        "user": "user-3",
    }
    items: list[Any] = [{"role": "user", "content": OPENING}]
    for step in range(12):
        items += read_file_round(step)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        await client.responses.create(model=MODEL, input=items, tools=TOOLS, **options)
    calls = [r.body for r in fake.summary_requests if r.path.endswith("/responses")]
    assert calls and all(call is not None for call in calls)
    assert all({k: call.get(k) for k in options} == options for call in calls if call)


async def test_a_summary_call_in_responses_form_carries_integers_beyond_64_bits_as_sent(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """The cache-safe call sends the forwarded items byte for byte: an integer past 64 bits
    (which a plain JSON parse turns into a float) reaches it as the client wrote it."""
    big = 123456789012345678901234567890
    items: list[Any] = [{"role": "user", "content": OPENING, "ticket": big}]
    for step in range(12):
        items += read_file_round(step)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        await client.responses.create(model=MODEL, input=items, tools=TOOLS)
    calls = [r for r in fake.summary_requests if r.path.endswith("/responses")]
    assert calls and all(call.body is not None for call in calls)
    assert all(call.body["input"][0] == items[0] for call in calls if call.body)
    assert all(type(call.body["input"][0]["ticket"]) is int for call in calls if call.body)


async def test_an_overflow_in_the_responses_shape_is_recovered_streamed(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    # No window known to the proxy, and the Responses error states none: the failed request's
    # own size bounds the summary.
    fake.windows[MODEL] = 8_000
    proxy = await make_proxy(routes=routes(upstream_url, None))
    items: list[Any] = [{"role": "user", "content": OPENING}]
    for step in range(8):
        items += read_file_round(step, f"c{step}")
    items.append({"role": "user", "content": "Where are we?"})
    before = counter("compaction_proxy_overflow_recoveries_total", result="retried")
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        stream = await client.responses.create(model=MODEL, input=items, stream=True)
        kinds = [event.type async for event in stream]
    assert kinds[-1] == "response.completed"
    assert (
        REGISTRY.get_sample_value(
            "compaction_proxy_overflow_recoveries_total", {"result": "retried"}
        )
        == before + 1
    )


async def test_a_stateful_request_is_forwarded_as_sent_and_counted(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    labels = {"route": "resp-*", "outcome": "stateful"}
    before = counter("compaction_proxy_requests_total", **labels)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        response = await client.responses.create(
            model=MODEL, previous_response_id="resp_earlier", input="And then?"
        )
    assert response.output_text
    assert fake.responses.forwarded[-1] == {
        "model": MODEL,
        "previous_response_id": "resp_earlier",
        "input": "And then?",
    }
    assert REGISTRY.get_sample_value("compaction_proxy_requests_total", labels) == before + 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": 7}, "input"),
        ({"model": MODEL, "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"model": MODEL, "input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"model": MODEL, "input": "x", "instructions": 3}, "instructions"),
    ],
)
async def test_malformed_input_is_a_400_naming_the_param(
    proxy: RunningProxy, body: dict[str, Any], param: str
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.post("/responses", body=body, cast_to=object)
    assert refused.value.param == param


async def test_a_zstd_compressed_request_as_codex_sends_it_is_read_and_forwarded_plain(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """Codex compresses its Responses requests with zstd; the upstream gets plain JSON."""
    body = {
        "model": MODEL,
        "instructions": "You are terse.",
        "input": [{"role": "user", "content": "Compress me."}],
    }
    packed = compressed(orjson.dumps(body), "zstd")
    headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/responses", data=packed, headers=headers) as answer:
            assert answer.status == 200
            assert (await answer.json())["output"][0]["type"] == "message"
            assert answer.headers["X-Compaction-Status"] == "none"
    assert fake.responses.forwarded[-1] == body


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_an_agent_loop_outgrowing_its_background_round_goes_on_through_the_bridge(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """With precompaction on and a slow summary, an agent whose calls come back faster than
    the round: the requests past ``must_compact`` go at once with their oldest outputs cut
    (pairs kept: the fake refuses a call without its output), none waits, and the request
    after the checkpoint carries no cut."""
    fake.windows[MODEL] = WINDOW
    fake.responses.tool_rounds = 1_000
    fake.summary_delay = 3.0
    proxy = await make_proxy(
        routes=[
            {
                "model": "resp-*",
                "base_url": upstream_url,
                "context_window": WINDOW,
                "policy": MASKING_OFF,
            }
        ]
    )
    items: list[Any] = [{"role": "user", "content": OPENING}]
    statuses, latencies = [], []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-r", max_retries=0) as client:
        for _ in range(18):
            started = time.perf_counter()
            raw = await client.responses.with_raw_response.create(
                **REQUEST, input=items, tools=TOOLS
            )
            latencies.append(time.perf_counter() - started)
            statuses.append(raw.headers["x-compaction-status"])
            items = next_request(items, raw.parse().output)
        assert "precompacting" in statuses and "pruned" in statuses, statuses
        assert "compacted" not in statuses and max(latencies) < fake.summary_delay / 2
        bridged = forwarded_inputs(fake)[statuses.index("pruned")]
        outputs = [i["output"] for i in bridged if i.get("type") == "function_call_output"]
        assert CUT in outputs[0] and CUT not in outputs[-1], "oldest cut, the newest whole"
        await proxy.app[SERVICES].background.idle()
        await client.responses.create(**REQUEST, input=items, tools=TOOLS)
    last = forwarded_inputs(fake)[-1]
    assert "<compacted-summary>" in last[0]["content"]
    assert not any(CUT in i.get("output", "") for i in last), "the cuts were never stored"
