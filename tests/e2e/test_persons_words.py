"""A person's words are never cut to make a request fit.

A lone user message, a person chatting who then pastes a contract, an agent's task: when such a
request cannot fit, the client gets the upstream's own overflow error, and every request the
upstream received carried the person's text whole. Only an agent's outputs (tool results, and
the user messages an observation-style agent returns its outputs in) may be cut.
"""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import assistant, system, user
from tests.conftest import ProxyFactory
from tests.helpers import chat, route

pytest.importorskip("anthropic")
pytest.importorskip("openai")

import anthropic
import openai

WINDOW = 8_192
CONTRACT = "".join(f"Clause {i}. The parties agree to terms set out here. " for i in range(1_200))
ISSUE = "".join(f"Traceback line {i}: File 'importer.py', line {i}\n" for i in range(2_000))
CUT_MARKS = ("cut by compaction-proxy", "removed by compaction-proxy", "cleared by compaction")

PERSONS: dict[str, list[dict[str, Any]]] = {
    "a lone user message": [user(CONTRACT)],
    "a person chatting, then pasting a contract": [
        system(),
        user("Hi! Can you help me read contracts?"),
        assistant("Of course. Paste the contract and ask away."),
        user("Thanks. First: what makes a clause binding?"),
        assistant("Offer, acceptance, consideration and intent."),
        user("Here it is, please summarize it:\n" + CONTRACT),
    ],
    "an agent's task": [system(), user(ISSUE)],
}


def whole_everywhere(bodies: list[dict[str, Any]], text: str) -> bool:
    """Whether every body the upstream received carries ``text`` whole in one message."""
    return bool(bodies) and all(
        any(text in str(m.get("content")) for m in body["messages"]) for body in bodies
    )


@pytest.mark.parametrize("case", list(PERSONS), ids=list(PERSONS))
async def test_a_persons_words_are_never_cut_the_upstreams_overflow_error_stands(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, case: str
) -> None:
    fake.windows["gpt-4"] = WINDOW
    proxy = await make_proxy(routes=[route(upstream_url, "gpt-4", WINDOW, precompact_ratio=0)])
    messages = PERSONS[case]
    with pytest.raises(openai.BadRequestError) as refused:
        await chat(proxy.url, messages, "gpt-4")
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "context_length_exceeded"
    pasted = CONTRACT if case != "an agent's task" else ISSUE
    bodies = [r.body for r in fake.chat_requests if r.body is not None]
    assert whole_everywhere(bodies, pasted)
    assert not any(mark in str(body) for body in bodies for mark in CUT_MARKS)


async def test_a_persons_pasted_document_is_never_cut_in_anthropics_format(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows["claude-small"] = WINDOW
    proxy = await make_proxy(
        anthropic_base_url=upstream_url,
        routes=[route(upstream_url, "claude-small", WINDOW, precompact_ratio=0)],
    )
    async with anthropic.AsyncAnthropic(
        base_url=proxy.root, api_key="sk-ant-own", max_retries=0
    ) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="claude-small",
                max_tokens=200,
                messages=[
                    {"role": "user", "content": "Can you review a contract?"},
                    {"role": "assistant", "content": "Yes, paste it."},
                    {"role": "user", "content": CONTRACT},
                ],
            )
    assert "prompt is too long" in str(refused.value.body)
    bodies = [r.body for r in fake.messages.received]
    assert whole_everywhere(bodies, CONTRACT)
    assert not any(mark in str(body) for body in bodies for mark in CUT_MARKS)


async def test_an_observation_style_agents_huge_output_is_still_rescued(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """mini-SWE-agent answers every command with a user message holding <returncode> and
    <output>: that message is an agent's output, cut to fit when it never could."""
    fake.windows["gpt-4"] = WINDOW
    proxy = await make_proxy(routes=[route(upstream_url, "gpt-4", WINDOW, precompact_ratio=0)])
    output = "<returncode>0</returncode>\n<output>\n" + "x" * 120_000 + "\n</output>"
    turn = [
        system(),
        user("Fix the importer."),
        assistant("THOUGHT: look at the tree.\n\n```bash\nls -R /\n```"),
        user(output),
    ]
    answer = await chat(proxy.url, turn, "gpt-4")
    assert answer.headers["x-compaction-status"] == "rescued"
    forwarded = fake.chat_requests[-1].body["messages"]
    assert forwarded[1] == user("Fix the importer.") and "cut by compaction-proxy" in str(
        forwarded[-1]
    )


async def test_a_chat_under_pressure_has_none_of_its_messages_cut(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """A person's long conversation, its pasted document in the history: pruning, masking and
    rescue find no observation in it, so no message is cut (a checkpoint may still summarize
    the oldest turns, as it would any history)."""
    window = 16_000
    fake.windows["gpt-4-16k"] = window
    proxy = await make_proxy(
        routes=[
            route(
                upstream_url,
                "gpt-4-16k",
                window,
                precompact_ratio=0,
                masking={"enabled": True},
            )
        ]
    )
    messages = [
        system(),
        user("Can you help with this agreement?"),
        assistant("Sure."),
        user("Here it is:\n" + CONTRACT[:56_000]),
        assistant("It sets out terms between the parties."),
        user("What does clause 7 say?"),
    ]
    answer = await chat(proxy.url, messages, "gpt-4-16k")
    assert answer.headers["x-compaction-status"] not in ("pruned", "masked", "rescued")
    sent = [str(r.body) for r in fake.chat_requests]
    assert not any(mark in body for body in sent for mark in CUT_MARKS)
