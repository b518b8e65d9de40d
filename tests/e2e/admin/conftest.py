"""The admin API's tests: a proxy with an admin token in front of the fake upstream."""

from __future__ import annotations

import pytest

from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import ADMIN_TOKEN, admin_routes


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, upstream_url: str) -> RunningProxy:
    return await make_proxy(admin_token=ADMIN_TOKEN, routes=admin_routes(upstream_url))
