"""Fixtures of the system tier's tests."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.prometheus_server import Prometheus


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (.ci/run installs Debian's)")
    server = Prometheus(binary, tmp_path)
    yield server
    await server.stop()
