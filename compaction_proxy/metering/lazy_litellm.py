"""litellm, imported off the start-up path.

Importing litellm takes seconds, and the proxy needs it for little: a tokenizer for a few model
families and a fallback overflow check (its model map and tiktoken files are read as plain
package data, see ``windows`` and ``tokenizers``). So ``serve`` starts listening without it and
imports it in a worker thread. While that import runs, ``available()`` says no and those
features do without for a moment (counting falls back to tiktoken, the overflow check to the
proxy's own patterns) rather than block the event loop on the import lock. Where nothing
started the import (the CLI, unit tests), the first caller imports litellm itself.

Invariant: ``available()`` never waits for an import another thread is running.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import threading

from compaction_proxy.metering.tokenizers import use_bundled_tokenizers

_lock = threading.Lock()
_started = False
_imported = threading.Event()  # set once the import is over, failed or not
_importable = False


def _import() -> None:
    global _importable
    use_bundled_tokenizers()  # also keeps litellm's import from fetching its model map
    try:
        importlib.import_module("litellm")
        _importable = True
    except ImportError:
        _importable = False
    finally:
        _imported.set()
    # litellm leaves a very large object graph behind; keep the cyclic collector from walking
    # it again on every full collection (those pauses showed up as p99 latency).
    gc.freeze()


def _claim() -> bool:
    """Whether the caller is the one to import (nobody started yet)."""
    global _started
    with _lock:
        if _started:
            return False
        _started = True
        return True


async def import_in_background() -> None:
    """Import litellm in a thread of its own (the app awaits this as a background task). A
    daemon thread: a process told to stop exits without waiting for an import still running
    (it takes seconds, more on a busy host; an executor's thread would be joined at exit)."""
    if not _claim():
        return
    loop = asyncio.get_running_loop()
    over: asyncio.Future[None] = loop.create_future()

    def finished() -> None:
        if not over.done():  # not cancelled meanwhile (the app shutting down)
            over.set_result(None)

    def run() -> None:
        try:
            _import()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(finished)

    threading.Thread(target=run, name="litellm-import", daemon=True).start()
    await over


def settle(timeout: float) -> bool:
    """At exit: wait up to ``timeout`` seconds for an import under way to end; whether none is
    under way now. A process must not finalize while the import runs: importlib holds the
    interpreter's import lock around every finder's look for a module (file system calls
    included), about a fifth of the import's time here; a daemon thread is frozen wherever it
    is at finalization, the lock still held, and any import finalization makes then (the
    traceback of a destructor that fails loads the module that shows source lines) waits for it
    forever. ``tests/exit_probe.py`` reproduces it with this import."""
    return not _started or _imported.wait(timeout)


async def loaded() -> None:
    """Wait (off the event loop) until an import started elsewhere is over."""
    if _started and not _imported.is_set():
        await asyncio.to_thread(_imported.wait)


def available() -> bool:
    """Whether litellm can be used now: imported, or importable right here when nobody is
    importing it elsewhere."""
    if _imported.is_set():
        return _importable
    if _claim():
        _import()
        return _importable
    return False
