"""How a background round ends, told in the log: a store gone mid-round is a warning without a
traceback, as everywhere else; a failure of our own keeps its traceback; a cancelled round
counts as cancelled; and waiting for the rounds to end returns once they have."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from compaction_proxy.compaction.background import BackgroundCompactions
from compaction_proxy.store.base import StoreUnavailable
from tests.helpers import counter


class FailingEngine:
    """An engine whose summary round raises ``failure``."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure

    async def summarize_round(self, *_: Any) -> Any:
        raise self.failure


def stub_job() -> Any:
    return SimpleNamespace(view=SimpleNamespace(surface=lambda records: None))


async def run_round(failure: BaseException) -> None:
    rounds = BackgroundCompactions(FailingEngine(failure), 1)  # type: ignore[arg-type]
    await rounds._round(stub_job(), SimpleNamespace(records=()), 0, 0)  # type: ignore[arg-type]


async def test_a_store_gone_mid_round_is_a_warning_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "compaction_proxy.compaction.background"):
        await run_round(StoreUnavailable("commit"))
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "store unavailable" in record.getMessage() and "commit" in record.getMessage()


async def test_a_failure_of_our_own_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "compaction_proxy.compaction.background"):
        await run_round(RuntimeError("a bug"))
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None


async def test_a_cancelled_round_is_counted_as_cancelled() -> None:
    name = "compaction_proxy_precompaction_duration_seconds_count"
    before = counter(name, outcome="cancelled")
    with pytest.raises(asyncio.CancelledError):
        await run_round(asyncio.CancelledError())
    assert counter(name, outcome="cancelled") == before + 1


async def nothing() -> None:
    return None


@pytest.mark.timeout(10)  # the signal interrupts a loop that never yields
async def test_idle_returns_when_a_round_has_ended_but_is_still_held() -> None:
    rounds = BackgroundCompactions(FailingEngine(RuntimeError()), 1)  # type: ignore[arg-type]
    task = asyncio.ensure_future(nothing())
    rounds._running["c"] = task  # held as ``start`` holds it, let go by its done callback
    task.add_done_callback(lambda _: rounds._running.pop("c", None))
    await asyncio.sleep(0)  # the round ends on this turn; its callback runs on the next
    assert task.done() and "c" in rounds._running
    await rounds.idle()
    assert not rounds._running
