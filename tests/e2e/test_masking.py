"""Observation masking end to end: old tool outputs cleared to placeholders before any summary
is paid for, stored so that every later request sends the same bytes, in each API's form."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.conversation.replacements import Prune
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_history, assistant, file_output, tool, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import ADMIN_TOKEN, UNCACHED, admin, chat, counter, route

pytest.importorskip("anthropic")

import anthropic

MODEL = "mask-model"
WINDOW = 16_000
MASKS = "compaction_proxy_compactions_total"


async def start(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, **policy: Any
) -> RunningProxy:
    fake.windows[MODEL] = WINDOW
    policy = {**UNCACHED, **policy}
    return await make_proxy(routes=[route(upstream_url, "mask-*", WINDOW, **policy)])


async def test_old_outputs_are_masked_instead_of_summarized_and_stay_masked(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, store_url: str
) -> None:
    fake.windows[MODEL] = WINDOW
    proxy = await make_proxy(
        admin_token=ADMIN_TOKEN,
        store_url=store_url,
        routes=[route(upstream_url, "mask-*", WINDOW, **UNCACHED)],
    )
    committed = counter(MASKS, trigger="pressure", mechanism="mask", outcome="committed")
    saved = counter("compaction_proxy_tokens_saved_total", route="mask-*", mechanism="mask")
    history = agent_history()
    first = await chat(proxy.url, history, MODEL)
    assert first.headers["x-compaction-status"] == "masked"
    assert fake.summary_requests == []  # no summary paid for
    assert int(first.headers["x-compaction-tokens"]) <= 0.7 * WINDOW
    assert counter(MASKS, trigger="pressure", mechanism="mask", outcome="committed") == (
        committed + 1
    )
    tokens_before = int(first.headers["x-compaction-tokens-before"])
    saved_now = counter("compaction_proxy_tokens_saved_total", route="mask-*", mechanism="mask")
    assert 0.5 * (tokens_before - int(first.headers["x-compaction-tokens"])) < saved_now - saved
    sent = fake.chat_requests[-1].body["messages"]
    cleared = [i for i, m in enumerate(history) if m["role"] == "tool" and sent[i] != m]
    assert cleared
    for i in cleared:
        index = (i - 3) // 2
        assert sent[i] == {
            **history[i],
            "content": (
                "[compaction-proxy cleared this output of read_file(path='src/m"
                f"{index}.py') to save context: {len(history[i]['content']):,} characters. "
                "Run the tool again if you need it.]"
            ),
        }
    # The newest three observations, the calls, the task and the live turn go as sent.
    tools = [i for i, m in enumerate(history) if m["role"] == "tool"]
    assert set(cleared).isdisjoint(tools[-3:])
    assert [m for i, m in enumerate(sent) if i not in cleared] == [
        m for i, m in enumerate(history) if i not in cleared
    ]

    # The next turn sends the very same bytes before its new messages: one cache miss.
    later = [*history, assistant("Reading on."), user("Go on.")]
    second = await chat(proxy.url, later, MODEL)
    assert second.headers["x-compaction-status"] == "masked"
    assert second.headers["x-compaction-generation"] == first.headers["x-compaction-generation"]
    assert fake.chat_requests[-1].body["messages"][: len(sent) - 1] == sent[:-1]

    conversation = second.headers["x-compaction-conversation"]
    log = await proxy.read_log(conversation)
    positions = [i - 1 for i in cleared]  # in the body: after the system prompt
    assert sorted(e["position"] for e in log if e["type"] == "mask") == positions
    status, surface = await admin(proxy, "GET", f"/conversations/{conversation}/surface")
    assert status == 200
    masked = [n for n in surface["nodes"] if n.get("masked")]
    assert [n["start"] for n in masked] == positions
    assert all(n["chars_before"] > 2_000 > n["chars_after"] for n in masked)
    status, records = await admin(proxy, "GET", f"/conversations/{conversation}")
    assert status == 200
    assert {r["kind"] for r in records["records"]} == {"mask"}


async def test_with_masking_off_the_history_is_summarized(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake, masking={"enabled": False})
    history = agent_history()
    reply = await chat(proxy.url, history, MODEL)
    # On first contact it goes at once, older outputs cut for it alone, and is summarized
    # behind it; the next request carries the checkpoint.
    assert reply.headers["x-compaction-status"] == "pruned"
    await proxy.app[SERVICES].background.idle()
    more = [*history, assistant("Reading on."), user("Go on.")]
    assert (await chat(proxy.url, more, MODEL)).headers["x-compaction-status"] == "compacted"
    assert len(fake.summary_requests) == 1


async def test_an_excluded_tools_outputs_are_never_cleared(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(
        make_proxy, upstream_url, fake, masking={"keep": 1, "exclude_tools": ["bash"]}
    )
    history = agent_history()
    history[4] = assistant(None, ("call_1", "bash", '{"command": "make"}'))
    reply = await chat(proxy.url, history, MODEL)
    assert reply.headers["x-compaction-status"] == "masked"
    sent = fake.chat_requests[-1].body["messages"]
    cleared = [i for i, m in enumerate(history) if sent[i] != m]
    assert cleared and 5 not in cleared  # the bash output stays
    assert all("output of read_file(" in sent[i]["content"] for i in cleared)
    tools = [i for i, m in enumerate(history) if m["role"] == "tool"]
    assert tools[-1] not in cleared  # the newest is never cleared


async def test_between_the_watermarks_masks_are_prepared_instead_of_a_summary(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Precompaction on: at 70 % a summary would be prepared in the background. Masking frees
    enough, so the masks are committed instead, for the next request, and no summary is."""
    proxy = await start(make_proxy, upstream_url, fake)
    prepared = counter(MASKS, trigger="precompact", mechanism="mask", outcome="committed")
    history = agent_history(rounds=5, words=600)  # about 76 % of the window
    reply = await chat(proxy.url, history, MODEL)
    tokens = int(reply.headers["x-compaction-tokens"])
    assert 0.7 * WINDOW <= tokens < 0.8 * WINDOW
    assert reply.headers["x-compaction-status"] == "none"  # this one goes as it came
    assert counter(MASKS, trigger="precompact", mechanism="mask", outcome="committed") == (
        prepared + 1
    )
    state = await proxy.store.load(reply.headers["x-compaction-conversation"])
    assert state.records and all(isinstance(r, Prune) and r.masked for r in state.records)
    more = [*history, assistant("Reading on."), user("Go on.")]
    reply = await chat(proxy.url, more, MODEL)
    assert reply.headers["x-compaction-status"] == "masked"
    assert int(reply.headers["x-compaction-tokens"]) <= 0.6 * WINDOW
    assert fake.summary_requests == []


async def test_claude_code_tool_results_are_masked_in_messages_form(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows[MODEL] = WINDOW
    proxy = await make_proxy(routes=[route(upstream_url, "mask-*", WINDOW, **UNCACHED)])
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Fix the importer."}]
    for index in range(6):
        call = f"toolu_{index:03d}"
        use = {"type": "tool_use", "id": call, "name": "Read", "input": {"file_path": f"m{index}"}}
        turns.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": call, "content": file_output(f"r{index}x")}
        turns.append({"role": "user", "content": [result]})
    turns.append({"role": "user", "content": "Where are we?"})
    async with anthropic.AsyncAnthropic(
        base_url=proxy.url.removesuffix("/v1"), api_key="sk-ant-own", max_retries=0
    ) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=512,
            messages=turns,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "masked"
    assert fake.messages.refused == [] and fake.messages.summary_requests == []
    sent = fake.messages.received[-1].body["messages"]
    assert len(sent) == len(turns)
    first = sent[2]["content"][0]
    assert first["type"] == "tool_result" and first["tool_use_id"] == "toolu_000"
    assert first["content"].startswith("[compaction-proxy cleared this output of Read(")
    assert sent[-2] == turns[-2] and sent[-1] == turns[-1]


async def test_a_reread_of_a_masked_output_is_counted_and_not_masked_again(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Agents run a tool again when its output was cleared: the call repeating a masked one
    is counted, and its fresh output stays whole while the request fits."""
    proxy = await start(make_proxy, upstream_url, fake, precompact_ratio=0)
    history = agent_history()
    first = await chat(proxy.url, history, MODEL)
    assert first.headers["x-compaction-status"] == "masked"
    sent = fake.chat_requests[-1].body["messages"]
    cleared = [i for i, m in enumerate(history) if m["role"] == "tool" and sent[i] != m]
    assert 3 in cleared  # src/m0.py's output, the first read
    before = counter("compaction_proxy_masked_rereads_total", route="mask-*")
    again = [
        *history[:-1],
        assistant(None, ("call_again", "read_file", '{"path":"src/m0.py"}')),
        tool("call_again", file_output("m0x")),
    ]
    await chat(proxy.url, again, MODEL)
    await proxy.app[SERVICES].pending_log_writes.settled_all()  # counted after the answer
    assert counter("compaction_proxy_masked_rereads_total", route="mask-*") == before + 1
    # Three more reads age it past the newest three and the retained tail; pressure masks.
    later = list(again)
    for index in range(6, 9):
        call = f"call_{index}"
        later.append(assistant(None, (call, "read_file", f'{{"path": "src/m{index}.py"}}')))
        later.append(tool(call, file_output(f"m{index}x", words=300)))
    later.append(user("Where are we now?"))
    answer = await chat(proxy.url, later, MODEL)
    assert answer.headers["x-compaction-status"] == "masked"
    forwarded = fake.chat_requests[-1].body["messages"]
    reread = [m for m in forwarded if m.get("tool_call_id") == "call_again"]
    assert reread == [again[-1]]  # the re-read output, whole
    masked = [m for m in forwarded if "compaction-proxy cleared" in str(m.get("content"))]
    assert masked  # while older outputs around it were cleared
