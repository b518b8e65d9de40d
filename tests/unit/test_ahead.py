"""What a request reads from and writes to its conversation for the background rounds: the
largest answer and the last measurement, from attributes that may hold anything."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.ahead import (
    LARGEST_ANSWER,
    LAST_MEASURED_AT,
    LAST_TOKENS,
    answer_attributes,
    largest_answer,
    last_measured,
    measured_attributes,
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


def test_a_measurement_reads_back_as_written() -> None:
    assert last_measured(state(**measured_attributes(9_000, 1_700_000_000.25))) == (
        9_000,
        1_700_000_000.25,
    )


@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {LAST_TOKENS: "9000"},
        {LAST_TOKENS: "x", LAST_MEASURED_AT: "1.0"},
        {LAST_TOKENS: "9000", LAST_MEASURED_AT: "nan"},
        {LAST_TOKENS: "9000", LAST_MEASURED_AT: "inf"},
    ],
)
def test_a_missing_or_broken_measurement_gives_no_growth_rate(attributes: dict[str, str]) -> None:
    assert last_measured(state(**attributes)) is None
