"""A process told to stop in its first seconds, while litellm's import runs, exits.

The hang behind it (``lazy_litellm.settle``): finalizing while the import thread holds the
interpreter's import lock, with a destructor failing at finalization, waits forever (the log
ends mid-traceback). ``tests.bench.exit_during_import`` counts how often each way of stopping
hangs; here, the way ``serve`` leaves is checked in exactly that state.
"""

from __future__ import annotations

from tests.exit_probe import probe

EXIT_SECONDS = 10.0
HELD_EXITS = 3  # exits made with the lock held (the probe's thread may let go just before)
ATTEMPTS = 12


async def test_leaving_as_serve_does_exits_with_the_import_lock_held_and_a_failing_destructor() -> (
    None
):
    held = 0
    for _ in range(ATTEMPTS):
        run = await probe("proxy", EXIT_SECONDS)
        assert run.status == 0  # it exited, with status 0, within EXIT_SECONDS
        assert run.line.startswith("import lock held at exit: ")
        held += run.held
        if held == HELD_EXITS:
            break
    assert held == HELD_EXITS  # the state that hangs finalization was reached, and left
