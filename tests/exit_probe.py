"""A process that stops while litellm's import runs in the background, as ``serve`` does.

Run as ``python -m tests.exit_probe MODE``. litellm's import starts in its daemon thread
(``lazy_litellm.import_in_background``); the process waits until that thread holds the
interpreter's import lock (importlib holds it around every finder's look for a module, file
system calls included), then stops with an object in ``__main__`` whose destructor raises, as
one of litellm's did in the log of a process that never exited. Modes:

- ``finalize``: stops the way a Python program does (the interpreter finalizes);
- ``quiet``: the same, without the failing destructor;
- ``proxy``: leaves as ``serve`` does (``cli.exit_after_an_import_under_way``);
- ``sample``: lets the import finish, and prints how often its thread held the lock when this
  one took the interpreter back.

Otherwise the one line printed says whether the lock was still held as the process stopped.
``probe`` runs one such process; ``tests.bench.exit_during_import`` (how often each way hangs)
and ``tests/system/test_exit_during_import.py`` use it.
"""

from __future__ import annotations

import _imp
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass

from compaction_proxy.metering import lazy_litellm
from compaction_proxy.ops.cli import exit_after_an_import_under_way

WAIT_SECONDS = 30.0  # for the import thread to hold the lock (it does about a fifth of the time)
HELD_LINE = "import lock held at exit: True"


@dataclass(frozen=True)
class ProbeRun:
    """One probe process, seen from outside."""

    line: str  # the one line it printed
    seconds: float | None  # from its start to its exit; None: it hung, and was killed
    status: int | None  # its exit status; None when it hung

    @property
    def held(self) -> bool:
        """Whether it stopped with the import lock held."""
        return self.line == HELD_LINE


async def probe(mode: str, hang_seconds: float) -> ProbeRun:
    """Run ``python -m tests.exit_probe MODE``; one still running ``hang_seconds`` on hangs."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.exit_probe",
        mode,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = ""
    try:
        async with asyncio.timeout(hang_seconds):
            line = (await process.stdout.readline()).decode().strip()
            status = await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
        return ProbeRun(line, None, None)
    return ProbeRun(line, time.monotonic() - started, status)


class RaisesWhenCollected:
    """Stands in for a library object whose destructor fails at finalization: the traceback
    printed for it loads the module that shows source lines, through the import lock."""

    def __del__(self) -> None:
        raise RuntimeError("a destructor failing at finalization")


async def until_the_import_lock_is_held() -> bool:
    """Start the import as ``serve`` does; wait until its thread holds the import lock (True),
    or the import ends (False)."""
    importing = asyncio.create_task(lazy_litellm.import_in_background())
    deadline = time.monotonic() + WAIT_SECONDS
    while not importing.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.0005)  # the import thread runs, then yields to this one
        if _imp.lock_held():
            importing.cancel()  # the thread goes on: only the wait for it ends
            return True
    importing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await importing
    return False


async def held_share() -> tuple[int, int]:
    """The whole import, sampled: of the moments this thread took the interpreter back, how
    many found the import thread holding the import lock."""
    importing = asyncio.create_task(lazy_litellm.import_in_background())
    samples = held = 0
    while not importing.done():
        await asyncio.sleep(0.0005)
        samples += 1
        held += _imp.lock_held()
    return held, samples


def main(mode: str) -> None:
    if mode == "sample":
        held, samples = asyncio.run(held_share())
        print(f"import lock held in {held} of {samples} samples", flush=True)
        return
    held = asyncio.run(until_the_import_lock_is_held())
    if mode != "quiet":
        global collected_at_finalization
        collected_at_finalization = RaisesWhenCollected()
    print(HELD_LINE if held and _imp.lock_held() else "import lock held at exit: False", flush=True)
    if mode == "proxy":
        exit_after_an_import_under_way()


collected_at_finalization: RaisesWhenCollected | None = None

if __name__ == "__main__":
    main(sys.argv[1])
