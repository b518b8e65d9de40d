"""What a request reads from and writes to its conversation for the background rounds: the
largest answer, from attributes that may hold anything."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.ahead import (
    LARGEST_ANSWER,
    answer_attributes,
    largest_answer,
)
from proxy.store.base import ConversationState


def state(**attributes: str) -> ConversationState:
    return ConversationState(attributes=attributes)


@pytest.mark.parametrize(
    ("stored", "largest"),
    [(None, None), ("300", 300), ("", None), ("-3", None), ("1e3", None), ("٣", None)],
)
def test_the_largest_answer_is_read_only_from_ascii_digits(
    stored: str | None, largest: int | None
) -> None:
    attributes = {} if stored is None else {LARGEST_ANSWER: stored}
    assert largest_answer(state(**attributes)) == largest


@pytest.mark.parametrize(
    ("previous", "usage", "written"),
    [
        (None, {"completion_tokens": 120}, {LARGEST_ANSWER: "120"}),
        ("300", {"completion_tokens": 120}, {}),  # smaller: the largest stays
        ("300", {"completion_tokens": 301}, {LARGEST_ANSWER: "301"}),
        (None, {"completion_tokens": 0}, {}),
        (None, {"completion_tokens": True}, {}),
        (None, {"completion_tokens": "120"}, {}),
        (None, {}, {}),
    ],
)
def test_an_answer_raises_the_largest_only_when_larger(
    previous: str | None, usage: dict[str, Any], written: dict[str, str]
) -> None:
    attributes = {} if previous is None else {LARGEST_ANSWER: previous}
    assert answer_attributes(state(**attributes), usage) == written
    assert answer_attributes(None, usage) == {}
