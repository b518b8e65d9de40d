"""A supervisor's stop is bounded: a worker that does not go after SIGTERM is killed."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time

import pytest

from compaction_proxy.config.settings import Settings
from compaction_proxy.ops.workers import STOP_MARGIN_SECONDS, _stop_all, worker_stop_seconds

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
STOPS_ON_SIGTERM = "import sys, time\nprint('ready', flush=True)\ntime.sleep(60)\n"


async def started(code: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert await process.stdout.readline() == b"ready\n"  # its signal handling is in place
    return process


async def test_a_worker_still_there_after_its_time_to_stop_is_killed_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stubborn, willing = await started(IGNORES_SIGTERM), await started(STOPS_ON_SIGTERM)
    begun = time.monotonic()
    with caplog.at_level(logging.ERROR, "compaction_proxy.ops.workers"):
        await _stop_all([stubborn, willing], seconds=0.5)
    assert time.monotonic() - begun < 5.0
    assert stubborn.returncode == -signal.SIGKILL
    assert willing.returncode == -signal.SIGTERM
    assert f"worker {stubborn.pid} had not stopped" in caplog.text
    assert str(willing.pid) not in caplog.text


def test_a_worker_has_its_drain_and_its_last_records_before_it_is_killed() -> None:
    settings = Settings(shutdown_timeout=30.0)
    assert worker_stop_seconds(settings) == 60.0 + STOP_MARGIN_SECONDS
