"""A process told to stop in its first seconds, while litellm's import runs, exits.

The hang behind it (``lazy_litellm.settle``): finalizing while the import thread holds the
interpreter's import lock, with a destructor failing at finalization, waits forever (the log
ends mid-traceback). ``tests.bench.exit_during_import`` counts how often each way of stopping
hangs; here, the way ``serve`` leaves is checked in exactly that state.
"""

from __future__ import annotations

import asyncio
import sys

EXIT_SECONDS = 10.0
HELD_EXITS = 3  # exits made with the lock held (the probe's thread may let go just before)
ATTEMPTS = 12


async def leave_as_serve_does() -> bool:
    """One probe process leaving as ``serve`` does; whether the import lock was held as it
    left. It must exit, with status 0, within ``EXIT_SECONDS``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.exit_probe",
        "proxy",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(EXIT_SECONDS):
            line = await process.stdout.readline()
            status = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert status == 0
    assert line.startswith(b"import lock held at exit: ")
    return line == b"import lock held at exit: True\n"


async def test_leaving_as_serve_does_exits_with_the_import_lock_held_and_a_failing_destructor() -> (
    None
):
    held = 0
    for _ in range(ATTEMPTS):
        held += await leave_as_serve_does()
        if held == HELD_EXITS:
            break
    assert held == HELD_EXITS  # the state that hangs finalization was reached, and left
