"""The log cursor hint: when is the store's log known to hold a request's earlier messages."""

from __future__ import annotations

import pytest

from proxy.log_cursor import Cursor, LogCursors, log_is_contiguous

CHAIN = ["h0", "h1", "h2", "h3", "h4"]


@pytest.mark.parametrize(
    ("previous_tip", "start", "contiguous"),
    [
        (None, 0, True),  # everything was sent
        (None, 3, False),  # a wiped store: what precedes the hint is missing
        ((2, "h2"), 3, True),  # the log ended right before what we sent
        ((4, "h4"), 3, True),  # another replica logged further along our chain
        ((1, "h1"), 3, False),  # a gap before what we sent
        ((2, "x2"), 3, False),  # the log's tip is on another branch
        ((9, "h9"), 3, False),  # beyond this request: another, longer branch
    ],
)
def test_log_is_contiguous(
    previous_tip: tuple[int, str] | None, start: int, contiguous: bool
) -> None:
    assert log_is_contiguous(CHAIN, previous_tip, start) is contiguous


def test_cursors_are_bounded_least_recently_used_first() -> None:
    cursors = LogCursors(size=2)
    cursors.set("a", Cursor((1, "h1"), "ctx"))
    cursors.set("b", Cursor())
    cursors.get("a")
    cursors.set("c", Cursor())
    assert cursors.get("a").tip == (1, "h1")
    assert cursors.get("b") == Cursor()
