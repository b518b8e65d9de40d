"""A local three-master Redis Cluster for tests (``redis-server --cluster-enabled yes``)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortTaken(RuntimeError):
    """Another process took a node's port between its choice and the node's start."""


def _cluster_ports(count: int) -> list[int]:
    """Ports whose cluster bus port (+10000) is free too, from a random start: test workers
    choose theirs at about the same moment."""
    ports: list[int] = []
    candidate = random.randrange(21000, 25000)
    while len(ports) < count:
        if _free(candidate) and _free(candidate + 10000):
            ports.append(candidate)
        candidate += 1
    return ports


class RedisCluster:
    """A Redis Cluster of ``masters`` nodes in ``workdir``. Its processes are started with the
    environment as it was when it was made, copied then: it may be started on a thread of its
    own (``ClusterInBackground``), and a child started there with the process's own
    environment reads the C ``environ`` array after ``vfork``, which another thread adding a
    variable meanwhile moves (a test's ``setenv``): the child's ``execve`` then failed with
    ``OSError: [Errno 14] Bad address``."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            pytest.skip(
                "redis-server and redis-cli are needed for Redis Cluster tests "
                "(.ci/run installs them)"
            )
        self.server, self.cli = server, cli
        self.workdir = workdir
        self.ports = _cluster_ports(masters)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.environment = dict(os.environ)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}/0"

    def start(self, attempts: int = 3) -> None:
        """The nodes started and joined; on ports taken meanwhile by another process (another
        test worker's cluster), again on other ports."""
        for attempt in range(attempts):
            try:
                self._start_on_ports()
                return
            except PortTaken:
                self.stop()
                if attempt == attempts - 1:
                    raise
                self.processes, self.ports = [], _cluster_ports(len(self.ports))

    def _start_on_ports(self) -> None:
        for port in self.ports:
            node_dir = self.workdir / str(port)
            node_dir.mkdir(parents=True, exist_ok=True)
            self.processes.append(
                subprocess.Popen(
                    [
                        self.server,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--dir",
                        str(node_dir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    stdout=subprocess.DEVNULL,
                    env=self.environment,
                )
            )
        for port, process in zip(self.ports, self.processes, strict=True):
            self._wait(lambda p=port: self._cli(p, "ping") == "PONG")
            if f"process_id:{process.pid}" not in self._cli(port, "info", "server"):
                raise PortTaken(f"port {port} is another process's")
        subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.environment,
        )
        for port in self.ports:
            self._wait(lambda p=port: "cluster_state:ok" in self._cli(p, "cluster", "info"))

    def _cli(self, port: int, *args: str) -> str:
        command = [self.cli, "-p", str(port), *args]
        done = subprocess.run(command, capture_output=True, text=True, env=self.environment)
        return done.stdout.strip()

    @staticmethod
    def _wait(ready: object, seconds: float = 20.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.1)
        raise TimeoutError("redis cluster did not become ready")

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


async def started_cluster(workdir: Path) -> RedisCluster:
    cluster = RedisCluster(workdir)
    await asyncio.to_thread(cluster.start)
    return cluster


class ClusterInBackground:
    """A cluster started on a thread of its own while the first tests run. A new cluster takes
    about four seconds to say ``cluster_state:ok``, almost all of it waiting: redis-cli waits a
    second or two for the nodes to agree, and a master waits two seconds after it starts before
    it calls the cluster writable (Redis's ``CLUSTER_WRITABLE_DELAY``)."""

    def __init__(self) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="redis-cluster-")
        try:
            self._cluster = RedisCluster(Path(self._workdir.name))
        except BaseException:  # the binaries are missing: RedisCluster skips, saying so
            self._workdir.cleanup()
            raise
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="redis-cluster", daemon=True)
        self._thread.start()

    @staticmethod
    def possible() -> bool:
        return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None

    def _start(self) -> None:
        try:
            self._cluster.start()
        except BaseException as exc:  # re-raised in the test that asks for the cluster
            self._error = exc

    def ready(self) -> RedisCluster:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._cluster

    def stop(self) -> None:
        self._thread.join()
        self._cluster.stop()
        self._workdir.cleanup()
