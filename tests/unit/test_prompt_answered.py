"""A round prepared beside its own request learns whether that request's prompt was answered
(``service.exchange.prompt_answer_began`` as the answer begins, else
``resolve_prompt_answered`` once the request is over): only an answer to the prompt as it was
first sent counts, since only that prompt is cached where the round's summary call would read
it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from compaction_proxy.service.exchange import prompt_answer_began, resolve_prompt_answered


def forwarded(answered: asyncio.Future[bool] | None) -> Any:
    return SimpleNamespace(job=SimpleNamespace(prompt_answered=answered))


@pytest.mark.parametrize(
    ("status", "retried", "expected"),
    [
        (200, False, True),
        (400, False, False),  # refused (an overflow, a bad request): nothing was cached
        (529, False, False),
        (200, True, False),  # answered, but a retry's other prompt
        (None, False, False),  # no answer at all
    ],
)
async def test_only_an_answer_to_the_prompt_first_sent_counts(
    status: int | None, retried: bool, expected: bool
) -> None:
    answered = asyncio.get_running_loop().create_future()
    sent = forwarded(answered)
    last = forwarded(None) if retried else sent
    reply = None if status is None else SimpleNamespace(status=status)
    resolve_prompt_answered(sent, last, reply)  # type: ignore[arg-type]
    assert answered.result() is expected


async def test_a_request_without_a_round_beside_it_is_left_alone() -> None:
    resolve_prompt_answered(forwarded(None), forwarded(None), None)
    resolve_prompt_answered(SimpleNamespace(job=None), SimpleNamespace(job=None), None)  # type: ignore[arg-type]
    done = asyncio.get_running_loop().create_future()
    done.cancel()  # settled already (a round shut down): never set twice
    resolve_prompt_answered(forwarded(done), forwarded(done), None)
    assert done.cancelled()


@pytest.mark.parametrize(("status", "expected"), [(200, True), (400, False), (529, False)])
async def test_the_answer_beginning_settles_it_before_the_request_is_over(
    status: int, expected: bool
) -> None:
    answered = asyncio.get_running_loop().create_future()
    sent = forwarded(answered)
    began = prompt_answer_began(sent)
    assert began is not None
    began(status)
    assert answered.result() is expected
    # What the request ends with (a retry's answer, say) no longer changes it.
    resolve_prompt_answered(sent, forwarded(None), SimpleNamespace(status=200))  # type: ignore[arg-type]
    began(200)
    assert answered.result() is expected


def test_no_hook_without_a_round_beside_the_request() -> None:
    assert prompt_answer_began(forwarded(None)) is None
    assert prompt_answer_began(SimpleNamespace(job=None)) is None  # type: ignore[arg-type]
