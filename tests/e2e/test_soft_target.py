"""A soft target under the window (``target_tokens``) and steps chosen by the provider's prices
(``pricing``), end to end through the openai SDK: over the target nothing waits, and a
checkpoint is prepared only where it pays on the route's terms."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import assistant, system, tool, user
from tests.conftest import ProxyFactory
from tests.helpers import MASKING_OFF, chat, counter, route

MODEL = "target-model"
OVER = "compaction_proxy_over_threshold_requests_total"
WINDOW = 64_000
TARGET = 16_000  # precompaction from 11,200 tokens, the target's threshold at 12,800


def history(rounds: int, words: int) -> list[dict[str, Any]]:
    """An agent's ``rounds`` tool calls, each answered with about ``words`` * 3 tokens."""
    tag = uuid.uuid4().hex[:8]
    messages = [system(), user(f"Fix the importer ({tag}).")]
    for index in range(rounds):
        call = f"call_{index}"
        messages.append(assistant(None, (call, "read_file", f'{{"path": "m{index}.py"}}')))
        messages.append(tool(call, " ".join(f"w{index}x{i % 97}" for i in range(words))))
    messages.append(user("Where are we?"))
    return messages


async def sent_once(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    preset: str,
    messages: Any,
    **more: Any,
) -> tuple[int, str, bool]:
    """``messages`` sent once through a route with the soft target and ``preset``'s prices
    (and ``more`` policy): the request's tokens as it came, its status, and whether any step
    (a mask, a checkpoint) was committed once its rounds have finished."""
    fake.windows[MODEL] = WINDOW
    policy = {"target_tokens": TARGET, "pricing": {"preset": preset}, **more}
    proxy = await make_proxy(routes=[route(upstream_url, "target-*", WINDOW, **policy)])
    reply = await chat(proxy.url, messages, MODEL)
    await proxy.app[SERVICES].background.idle()
    state = await proxy.store.load(reply.headers["x-compaction-conversation"])
    headers = reply.headers
    tokens = int(headers.get("x-compaction-tokens-before", headers["x-compaction-tokens"]))
    return tokens, reply.headers["x-compaction-status"], bool(state.records)


@pytest.mark.parametrize(
    ("preset", "rounds", "words", "stepped"),
    [
        # A long conversation: many turns ahead to pay a step back (here, masking its many
        # small outputs, which costs less than a summary and saves as much).
        ("anthropic", 40, 70, True),
        # The same size in four turns: no step would pay back before it ends...
        ("anthropic", 4, 760, False),
        ("openai", 4, 760, False),
        ("deepseek", 4, 760, False),
        # ... except on a provider that caches nothing, where every resent token is paid whole.
        ("none", 4, 760, True),
    ],
)
async def test_over_a_soft_target_a_step_is_taken_only_where_it_pays(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    preset: str,
    rounds: int,
    words: int,
    stepped: bool,
) -> None:
    messages = history(rounds, words)
    tokens, status, committed = await sent_once(make_proxy, upstream_url, fake, preset, messages)
    assert 0.7 * TARGET <= tokens < 0.8 * TARGET  # between the target's watermarks
    assert status in ("none", "precompacting")  # this request went as it came, at once
    assert fake.chat_requests[0].body["messages"] == messages
    assert committed is stepped


async def test_over_a_soft_targets_threshold_a_request_no_step_pays_for_goes_as_it_came(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    messages = history(5, 900)
    over = counter(OVER, route="target-*", reason="soft_target")
    tokens, status, committed = await sent_once(
        make_proxy, upstream_url, fake, "anthropic", messages
    )
    assert counter(OVER, route="target-*", reason="soft_target") == over + 1
    assert 0.8 * TARGET <= tokens < 0.7 * WINDOW  # over the target's threshold, not the window's
    assert status == "none" and not committed
    assert fake.summary_requests == []
    assert fake.chat_requests[-1].body["messages"] == messages


@pytest.mark.parametrize(
    ("rounds", "words", "stepped"),
    [
        # Many turns ahead: the checkpoint pays back, and is made on the request.
        (60, 62, True),
        # The same size in five turns: it would not, and nothing is cut (no prune either).
        (5, 780, False),
    ],
)
async def test_with_nothing_prepared_in_the_background_a_checkpoint_is_made_only_where_it_pays(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    rounds: int,
    words: int,
    stepped: bool,
) -> None:
    messages = history(rounds, words)
    background_off = {"precompact_ratio": 0, **MASKING_OFF}
    tokens, status, committed = await sent_once(
        make_proxy, upstream_url, fake, "anthropic", messages, **background_off
    )
    assert 0.8 * TARGET <= tokens < 0.8 * WINDOW  # over the target's threshold, not the window's
    assert committed is stepped
    assert len(fake.summary_requests) == int(stepped)
    assert status == ("compacted" if stepped else "none")
    if not stepped:
        assert fake.chat_requests[-1].body["messages"] == messages
