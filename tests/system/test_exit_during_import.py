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


async def test_leaving_as_serve_does_exits_with_the_import_lock_held_and_a_failing_destructor() -> (
    None
):
    for _ in range(3):
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
        assert line == b"import lock held at exit: True\n"  # the state that hangs finalization
        assert status == 0
