"""A real Prometheus for the tests that check queries against a real proxy (the dashboard's
panels, the alerting rules), and the metrics the proxy exports, by the names queries use.

Each test starts its own server on a free port, scraping one target every second and, given
rules, evaluating them every second. A machine without the ``prometheus`` binary skips those
tests (``.ci/run`` installs Debian's).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.metrics import MetricWrapperBase

from compaction_proxy import metrics
from tests.processes import free_port, wait_until_ready

CHART = Path(__file__).parents[1] / "charts" / "compaction-proxy"
ALERT_RULES = CHART / "alerts" / "compaction-proxy.rules.yml"
SCRAPE_SECONDS = 1

# A metric named in a query, with its label matchers if any; a ``by (...)`` grouping.
SELECTOR = re.compile(r"(compaction_proxy_[a-z_]+)(\{[^}]*\})?")
GROUPING = re.compile(r"by \(([^)]*)\)")


def exported_labels() -> dict[str, frozenset[str]]:
    """Each metric the proxy exports, by its name in queries, with its labels."""
    found: dict[str, frozenset[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            labels = frozenset(value._labelnames)
            found[value._name] = labels
            found[f"{value._name}_total"] = labels
            for suffix in ("_bucket", "_sum", "_count"):
                found[f"{value._name}{suffix}"] = labels | {"le"}
    return found


def alert_rules() -> list[dict[str, Any]]:
    """The alerting rules the chart ships, every group's."""
    groups = yaml.safe_load(ALERT_RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in alert_rules()]


class Prometheus:
    """A real Prometheus server, scraping one target every second."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.base = f"http://127.0.0.1:{free_port()}"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, target: str, rules: Path | None = None) -> None:
        """Scrape ``target`` (host:port); with ``rules``, evaluate that rule file too."""
        config = self.workdir / "prometheus.yml"
        text = (
            f"global:\n  scrape_interval: {SCRAPE_SECONDS}s\n"
            f"  evaluation_interval: {SCRAPE_SECONDS}s\n"
            f"scrape_configs:\n  - job_name: compaction-proxy\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        if rules is not None:
            text += f"rule_files:\n  - '{rules}'\n"
        config.write_text(text)
        self.process = await asyncio.create_subprocess_exec(
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.base.removeprefix('http://')}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await wait_until_ready(f"{self.base}/-/ready")
        await self._scraped()

    async def _scraped(self, timeout: float = 30.0) -> None:
        """Once the target has been scraped: Prometheus hands new targets to its scrapers
        in batches, seconds after it calls itself ready."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not (await self.api("query", query="up == 1"))["result"]:
            assert asyncio.get_running_loop().time() < deadline, "the target was never scraped"
            await asyncio.sleep(0.2)

    async def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful answer of the HTTP API at ``/api/v1/{path}``."""
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.base}/api/v1/{path}", params=params) as response,
        ):
            answer = await response.json()
        assert answer["status"] == "success", (path, params, answer)
        return answer["data"]

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()
