"""``serve --workers N``: N worker processes on one port, under a small supervisor.

Each worker is ``compaction-proxy serve`` bound with ``SO_REUSEPORT``, so the kernel spreads
connections over them. The supervisor:

* (settings refuse the in-process store with several workers: each would hold a different
  part of every conversation);
* shares one ``PROMETHEUS_MULTIPROC_DIR`` (a fresh one unless set), so any worker's
  ``/metrics`` reports them all, and serves ``metrics_port`` itself when one is configured;
* on SIGTERM or SIGINT, passes it on and waits for the workers to drain (a worker not gone
  once its drain and its last records have had their ``shutdown_timeout`` each, and a margin,
  is killed: the supervisor never waits on a worker forever);
* on SIGHUP, reloads gracefully: starts a new set, waits until each listens, then stops the
  old ones (configuration is read again by the new workers);
* restarts a worker that died on its own;
* gives every worker one secret to vouch for the client a WebSocket frame's request to the
  port stands for: the kernel may hand that request to any of them (``security.loopback``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from compaction_proxy.config.settings import LOOPBACK_SECRET_ENV, ConfigError, Settings

log = logging.getLogger("compaction_proxy.ops.workers")

READY_LINE = b"compaction-proxy worker ready\n"
READY_TIMEOUT_SECONDS = 60.0


class Supervisor:
    """Starts, replaces and stops the worker processes."""

    def __init__(self, workers: int, worker_args: Sequence[str], stop_seconds: float) -> None:
        self._count = workers
        self._args = list(worker_args)
        self._stop_seconds = stop_seconds  # from SIGTERM until a worker still there is killed
        self._workers: dict[int, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        # One for every worker, reloads' included: a WebSocket frame's request to the port
        # may reach any of them (``security.loopback``).
        given = os.environ.get(LOOPBACK_SECRET_ENV)
        self._loopback_secret = given or secrets.token_hex(32)

    async def _spawn(self) -> asyncio.subprocess.Process:
        """A new worker, once it listens; raises WorkerDidNotStart."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "compaction_proxy",
            "serve",
            "--reuse-port",
            *self._args,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, LOOPBACK_SECRET_ENV: self._loopback_secret},
        )
        assert process.stdout is not None
        try:
            ready = await asyncio.wait_for(said_ready(process.stdout), READY_TIMEOUT_SECONDS)
        except TimeoutError:
            ready = False
        if not ready:
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                process.kill()
            await process.wait()
            raise WorkerDidNotStart("a worker process did not start (see its log above)")
        return process

    async def _spawn_set(self) -> list[asyncio.subprocess.Process]:
        """``workers`` new workers started side by side, once all listen; if one does not
        start, those that did are stopped and WorkerDidNotStart is raised."""
        spawned = await asyncio.gather(
            *(self._spawn() for _ in range(self._count)), return_exceptions=True
        )
        started = [p for p in spawned if isinstance(p, asyncio.subprocess.Process)]
        failed = [e for e in spawned if isinstance(e, BaseException)]
        if failed:
            await _stop_all(started, self._stop_seconds)
            raise failed[0]
        return started

    def _adopt(self, process: asyncio.subprocess.Process) -> None:
        self._workers[process.pid] = process
        watcher = asyncio.create_task(self._watch(process))
        self._tasks.add(watcher)
        watcher.add_done_callback(self._tasks.discard)

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """Pass on what the worker prints; restart it if it exits while still wanted."""
        assert process.stdout is not None
        async for line in process.stdout:
            sys.stdout.buffer.write(line)
        code = await process.wait()
        _mark_dead(process.pid)
        if self._workers.pop(process.pid, None) is not None and not self._stopping:
            log.warning("worker %d exited with status %s: starting another", process.pid, code)
            try:
                replacement = await self._spawn()
            except WorkerDidNotStart:
                log.error("the replacement worker did not start: %d left", len(self._workers))
                return
            if self._stopping:  # stopped while it started: it is not wanted any more
                await _stop_all([replacement], self._stop_seconds)
                return
            self._adopt(replacement)
            log.info("worker %d listening in place of %d", replacement.pid, process.pid)

    async def start(self) -> None:
        """All workers at once: each is up in the time one takes to start, not after the
        others (a worker that does not start stops those that did)."""
        for process in await self._spawn_set():
            self._adopt(process)
        log.info("%d workers listening: %s", self._count, sorted(self._workers))

    async def reload(self) -> None:
        """A new set of workers, then the old one drained; if a new worker does not start
        (a configuration broken since), the running workers stay."""
        try:
            fresh = await self._spawn_set()
        except WorkerDidNotStart:
            log.error("reload failed: a new worker did not start; the running workers stay")
            return
        old = list(self._workers.values())
        self._workers.clear()  # replaced: not to be restarted
        for process in fresh:
            self._adopt(process)
        await _stop_all(old, self._stop_seconds)
        log.info("reloaded: workers %s", sorted(self._workers))

    async def stop(self) -> None:
        """Stop every worker, and any replacement still starting (its watcher stops it once it
        listens), so no worker outlives the supervisor."""
        self._stopping = True
        await _stop_all(list(self._workers.values()), self._stop_seconds)
        await asyncio.gather(*self._tasks, return_exceptions=True)


class WorkerDidNotStart(Exception):
    pass


async def said_ready(stdout: asyncio.StreamReader) -> bool:
    """Whether the worker said it listens before it exited. What it printed before (a
    library's notice at import, say) is passed on: a worker is never taken for dead because
    another line came first."""
    async for line in stdout:
        if line == READY_LINE:
            return True
        sys.stdout.buffer.write(line)
    return False


async def _stop_all(processes: Sequence[asyncio.subprocess.Process], seconds: float) -> None:
    """SIGTERM to each (a worker drains its requests) unless already gone; wait for all, and
    kill those still there ``seconds`` on (a worker that hangs on its way out would otherwise
    hold its supervisor, and a stop or a reload, forever)."""
    for process in processes:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    waits = {asyncio.ensure_future(p.wait()): p for p in processes}
    if not waits:
        return
    _, late = await asyncio.wait(waits, timeout=seconds)
    for waiting in late:
        process = waits[waiting]
        log.error("worker %d had not stopped %.0f s after SIGTERM: killed", process.pid, seconds)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    await asyncio.gather(*waits)


def _mark_dead(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


STOP_MARGIN_SECONDS = 10.0


def worker_stop_seconds(settings: Settings) -> float:
    """How long a worker may take to stop: its requests in flight, then its last records, each
    given ``shutdown_timeout``, and a margin for the rest of its exit."""
    return 2 * settings.shutdown_timeout + STOP_MARGIN_SECONDS


def run_workers(settings: Settings, worker_args: Sequence[str]) -> int:
    """Supervise ``settings.workers`` processes until SIGTERM or SIGINT; the exit status."""
    own_metrics_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        own_metrics_dir = tempfile.mkdtemp(prefix="compaction-proxy-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = own_metrics_dir
    try:
        return asyncio.run(_supervise(settings, worker_args))
    finally:
        if own_metrics_dir is not None:
            shutil.rmtree(own_metrics_dir, ignore_errors=True)


async def _supervise(settings: Settings, worker_args: Sequence[str]) -> int:
    # Signals first: one that arrives while the workers start is acted on once they have.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: asyncio.Queue[None] = asyncio.Queue()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloads.put_nowait, None)
    supervisor = Supervisor(settings.workers, worker_args, worker_stop_seconds(settings))
    try:
        await supervisor.start()
    except WorkerDidNotStart as exc:
        await supervisor.stop()
        raise ConfigError(str(exc)) from exc
    if settings.metrics_port is not None:
        from compaction_proxy.metrics import serve_metrics_port

        serve_metrics_port(settings.host, settings.metrics_port)
    while not stop.is_set():
        reload = asyncio.ensure_future(reloads.get())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({reload, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (reload, stopped):
            waiter.cancel()
        if not stop.is_set():
            await supervisor.reload()
    await supervisor.stop()
    return 0


def exit_with_the_supervisor() -> None:
    """In a worker: stop gracefully (SIGTERM to itself) if the supervisor dies without
    stopping it (killed outright), rather than hold the port with nobody watching."""
    supervisor = os.getppid()

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
