"""Reading a summary call through to the end of an earlier prompt (``planning.read_through_end``),
for providers that read their cache only where a prompt set a breakpoint: the call's prefix
then ends where a prompt the client sent ended, never inside one and never in the live turn,
and only where reading the extra messages costs less than writing the span's last turns again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compaction_proxy.compaction import planning
from compaction_proxy.compaction.cache_prices import PRESETS, CachePrices
from compaction_proxy.compaction.planning import (
    SummaryRequest,
    read_through_end,
    with_readable_prefix,
)
from compaction_proxy.compaction.range_selection import PricedNode, Span
from compaction_proxy.compaction.summarize import KEPT_NOTE, summary_body
from compaction_proxy.testing.fake_answers import fake_summary
from tests.builders import assistant, system, user

ANTHROPIC = PRESETS["anthropic"]

# An observation-style agent: every answer a command, every observation a user message.
CONVERSATION = [
    system(),  # 0 head
    user("task"),  # 1: a prompt's end (answered by 2)
    assistant("THOUGHT: look\n```bash\nls\n```"),  # 2
    user("<returncode>0</returncode><output>a b</output>"),  # 3: a prompt's end
    assistant("THOUGHT: read\n```bash\ncat a\n```"),  # 4
    user("<returncode>0</returncode><output>text</output>"),  # 5: a prompt's end
    assistant("THOUGHT: edit\n```bash\nsed -i a\n```"),  # 6
    user("<returncode>0</returncode><output></output>"),  # 7: the live turn
]
LIVE = 7


def nodes(tokens: list[int]) -> list[PricedNode]:
    priced = [PricedNode(CONVERSATION[0], tokens[0], "head")]
    for index, message in enumerate(CONVERSATION[1:], start=1):
        priced.append(PricedNode(message, tokens[index], "body", index - 1, index - 1))
    return priced


def span_to(last: int, tokens: list[int]) -> Span:
    return Span(1, last, 0, last - 1, sum(tokens[1 : last + 1]))


TOKENS = [50, 40, 300, 100, 300, 100, 300, 100]


@pytest.mark.parametrize(
    ("last", "tokens", "room", "prices", "expected"),
    [
        # Ends on an answer: carried on through the observation the answer asked for.
        (2, TOKENS, None, ANTHROPIC, 3),
        (4, TOKENS, None, ANTHROPIC, 5),
        # Ends where a prompt did: read as it is.
        (3, TOKENS, None, ANTHROPIC, None),
        # The next prompt's end is the live turn, which no earlier prompt sent.
        (6, TOKENS, None, ANTHROPIC, None),
        # The observation costs more to read than the answer to write again.
        (4, [50, 40, 300, 100, 10, 1000, 300, 100], None, ANTHROPIC, None),
        # It does not fit the call.
        (4, TOKENS, 99, ANTHROPIC, None),
        (4, TOKENS, 100, ANTHROPIC, 5),
        # A provider that caches nothing reads nothing either way.
        (4, TOKENS, None, PRESETS["none"], None),
    ],
)
def test_the_call_reads_through_to_a_prompts_end_only_where_it_pays(
    last: int, tokens: list[int], room: int | None, prices: CachePrices, expected: int | None
) -> None:
    priced = nodes(tokens)
    assert read_through_end(priced, span_to(last, tokens), LIVE, tokens, room, prices) == expected


def test_the_live_turn_ends_a_prompt_only_when_the_request_itself_was_sent() -> None:
    # A round prepared beside its own request: that request's end is a prompt's end too.
    span = span_to(6, TOKENS)
    assert read_through_end(nodes(TOKENS), span, LIVE, TOKENS, None, ANTHROPIC) is None
    sent = read_through_end(nodes(TOKENS), span, LIVE, TOKENS, None, ANTHROPIC, live_turn_sent=True)
    assert sent == LIVE


async def test_a_call_waits_for_the_prompt_it_reads_through_and_not_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    def reading_through(answered: asyncio.Future[bool] | None) -> SummaryRequest:
        return SummaryRequest({}, read_through=SummaryRequest({}, not_before=answered))

    plain = SummaryRequest({})
    assert await with_readable_prefix(plain) is plain  # nothing to read through
    at_once = reading_through(None)  # an earlier prompt's end: cached already
    assert await with_readable_prefix(at_once) is at_once
    answered = loop.create_future()
    loop.call_later(0.01, answered.set_result, True)
    waited = reading_through(answered)
    assert await with_readable_prefix(waited) is waited
    refused = loop.create_future()
    refused.set_result(False)
    assert (await with_readable_prefix(reading_through(refused))).read_through is None
    monkeypatch.setattr(planning, "ANSWER_WAIT_SECONDS", 0.01)
    pending = loop.create_future()
    assert (await with_readable_prefix(reading_through(pending))).read_through is None
    assert not pending.cancelled()  # left for the forwarding to resolve


def test_the_gap_is_what_follows_the_last_prompt_end_inside_the_span() -> None:
    # The span ends on answer 4; the prompt before it ended at 3: only 4 is written again,
    # so an observation worth more than 11.5 times answer 4 is not worth reading.
    tokens = [50, 40, 300, 100, 100, 1149, 300, 100]
    assert read_through_end(nodes(tokens), span_to(4, tokens), LIVE, tokens, None, ANTHROPIC) == 5
    tokens[5] = 1150
    assert (
        read_through_end(nodes(tokens), span_to(4, tokens), LIVE, tokens, None, ANTHROPIC) is None
    )


def test_the_instruction_says_what_the_carried_messages_are_and_the_summary_leaves_them_out() -> (
    None
):
    head = [CONVERSATION[0]]
    span = [user("FACT-1: kept in the checkpoint"), CONVERSATION[2]]
    kept = [user("FACT-2: stays after the checkpoint")]
    plain = summary_body("m", head, span, None, 100)
    through = summary_body("m", head, span, None, 100, None, kept)
    assert through["messages"][:-1] == [*plain["messages"][:-1], *kept]
    assert (
        through["messages"][-1]["content"] == f"{plain['messages'][-1]['content']}\n\n{KEPT_NOTE}"
    )
    assert KEPT_NOTE not in plain["messages"][-1]["content"]
    summary = fake_summary(through)
    assert "FACT-1" in summary and "FACT-2" not in summary
    assert summary == fake_summary(plain)


def test_the_clients_own_instructions_still_come_last() -> None:
    body = summary_body("m", [], [CONVERSATION[2]], None, 100, "keep the paths", [CONVERSATION[3]])
    ask: Any = body["messages"][-1]["content"]
    assert ask.index(KEPT_NOTE) < ask.index("Also: keep the paths")
