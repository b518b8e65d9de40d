"""The inspector page in a real browser (Debian's chromium, driven by selenium) against a
real proxy process, after a replayed transcript compacted.

Selenium's calls block, so the browser is driven from a worker thread while the event loop
goes on serving the fake upstream. Set ``INSPECTOR_SCREENSHOTS`` to a folder to save the
screenshots the README shows.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy.http.inspector import SECURITY_HEADERS
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_history
from tests.helpers import MASKING_OFF, UNCACHED
from tests.processes import proxy_process
from tests.synthetic import agent_conversation
from tests.transcripts import replay_requests

pytest.importorskip("openai")

import openai

TOKEN = "inspector-admin-token"
SESSION = "inspect-me"
MODEL = "ui-model"
WINDOW = 16_000
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None or shutil.which("chromedriver") is None,
    reason="Debian's chromium and chromium-driver are not installed (.ci/run installs them)",
)


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    profile = tempfile.mkdtemp(prefix="inspector-chromium-")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1600",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def conversation() -> list[list[dict[str, Any]]]:
    """The requests of an agent conversation that outgrows a 16k window, its last user
    message carrying markup."""
    messages = agent_conversation(3, turns=24, observation_style=False, big_reads={8: 6_000})
    requests = replay_requests(messages)
    requests.append([*requests[-1], {"role": "user", "content": f"Check this: {HOSTILE}"}])
    return requests


async def replay(base: str) -> int:
    requests = conversation()
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-ui", max_retries=0) as client:
        await client.chat.completions.create(  # another conversation, for the search to skip
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Session-Id": "someone-else"},
        )
        for messages in requests:
            await client.chat.completions.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                extra_headers={"X-Session-Id": SESSION},
            )
    return len(requests)


def drive(driver: Any, base: str, requests: int, screenshots: Path | None) -> None:
    """Every check of the page, in the browser (blocking; run in a thread)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    # The page re-renders what it shows: an element found a moment ago may be gone.
    wait = WebDriverWait(driver, 20, ignored_exceptions=[StaleElementReferenceException])
    driver.get(f"{base}/admin/ui")
    wait.until(seen.visibility_of_element_located((By.ID, "token"))).send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()

    # The conversation, found by its session name.
    wait.until(seen.visibility_of_element_located((By.CSS_SELECTOR, "#conversations tbody tr")))
    if screenshots:
        driver.save_screenshot(str(screenshots / "inspector-list.png"))
    driver.find_element(By.ID, "search").send_keys(SESSION)
    driver.find_element(By.CSS_SELECTOR, "#search-form button").click()

    def only_ours(d: Any) -> Any:
        rows = d.find_elements(By.CSS_SELECTOR, "#conversations tbody tr")
        sessions = [r.find_element(By.TAG_NAME, "td").text for r in rows]
        return rows[0] if sessions == [SESSION] else False

    wait.until(only_ours).click()

    # The chart: one point per request, and a compaction marker.
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart circle.point")) == requests)
    markers = driver.find_elements(By.CSS_SELECTOR, "#chart .compaction-marker")
    assert markers and any(m.get_attribute("data-outcome") == "committed" for m in markers)
    # A point's numbers name what the provider's cache read of its prompt.
    titles = [
        point.find_element(By.TAG_NAME, "title").get_attribute("textContent") or ""
        for point in driver.find_elements(By.CSS_SELECTOR, "#chart circle.point")
    ]
    assert any(re.search(r"\d+ read from its cache", title) for title in titles), titles

    # A checkpoint expands to its summary text.
    checkpoint = wait.until(seen.presence_of_element_located((By.CSS_SELECTOR, "li.checkpoint")))
    summary = checkpoint.find_element(By.TAG_NAME, "summary")
    driver.execute_script("arguments[0].scrollIntoView()", summary)
    summary.click()
    assert checkpoint.find_element(By.TAG_NAME, "details").get_attribute("open") is not None
    assert checkpoint.find_element(By.CSS_SELECTOR, "details pre").text.strip()

    # Markup in a message is shown as text, never run or parsed.
    hostile = driver.find_element(
        By.XPATH, "//li[contains(@class, 'node')][.//pre[contains(., 'window.pwned')]]//pre"
    )
    assert HOSTILE in hostile.text
    assert hostile.find_elements(By.XPATH, ".//script | .//img") == []
    assert driver.execute_script("return window.pwned === undefined")

    if screenshots:
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(screenshots / "inspector-conversation.png"))

    # A region compaction chosen by selecting messages: the generation advances.
    generation = driver.find_element(By.ID, "generation").text
    body_nodes = driver.find_elements(By.CSS_SELECTOR, "li.node.body input.select")
    for box in body_nodes[:2]:
        driver.execute_script("arguments[0].scrollIntoView()", box)
        box.click()
    region = driver.find_element(By.ID, "compact-region")
    assert region.is_enabled()
    region.click()
    wait.until(lambda d: d.find_element(By.ID, "generation").text != generation)
    assert int(driver.find_element(By.ID, "generation").text) > int(generation)
    assert "committed" in driver.find_element(By.ID, "action-result").text


def inspected_proxy(upstream_url: str, policy: dict[str, Any]) -> dict[str, str]:
    """The environment of a proxy process with the admin API on, its route under ``policy``."""
    route = {"model": "ui-*", "base_url": upstream_url, "context_window": WINDOW, "policy": policy}
    return {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_TENANT_SECRET": "ui",
        "COMPACTION_PROXY_ADMIN_TOKEN": TOKEN,
        "COMPACTION_PROXY_ROUTES": orjson.dumps([route]).decode(),
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
    }


async def test_the_inspector_shows_a_compacted_conversation_and_compacts_a_region(
    browser: Any, fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows[MODEL] = WINDOW
    env = inspected_proxy(upstream_url, MASKING_OFF)
    folder = os.environ.get("INSPECTOR_SCREENSHOTS")
    screenshots = Path(folder) if folder else None
    async with proxy_process(env) as (_, base):
        requests = await replay(base)
        assert fake.summary_requests, "the replay was meant to compact"
        await asyncio.to_thread(drive, browser, base, requests, screenshots)


async def test_the_page_is_served_with_a_strict_policy_and_only_with_the_admin_api(
    upstream_url: str,
) -> None:
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "COMPACTION_PROXY_ADMIN_TOKEN": TOKEN,
    }
    async with proxy_process(env) as (_, base), aiohttp.ClientSession() as http:
        for path in ("/admin/ui", "/admin/ui/inspector.js", "/admin/ui/chart.js"):
            async with http.get(base + path) as response:
                assert response.status == 200
                for name, value in SECURITY_HEADERS.items():
                    assert response.headers[name] == value
        async with http.get(base + "/admin/ui") as response:
            page = await response.text()
        assert re.search(r"<script(?![^>]*\bsrc=)", page) is None  # no inline script
        assert re.search(r"\s(on[a-z]+|style)\s*=", page) is None  # no handlers, no styles
        for path in ("/admin/ui/..%2Fadmin.py", "/admin/ui/.hidden.js", "/admin/ui/x.py"):
            async with http.get(base + path) as response:
                assert response.status == 404
    async with proxy_process({"COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url}) as (_, base):
        async with aiohttp.ClientSession() as http, http.get(base + "/admin/ui") as response:
            assert response.status == 404


def drive_masked(driver: Any, base: str) -> None:
    """A masked conversation in the browser: each masked message says what was cleared."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 20, ignored_exceptions=[StaleElementReferenceException])
    driver.get(f"{base}/admin/ui")
    wait.until(seen.visibility_of_element_located((By.ID, "token"))).send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait.until(seen.visibility_of_element_located((By.CSS_SELECTOR, "#conversations tbody tr")))
    driver.find_element(By.CSS_SELECTOR, "#conversations tbody tr").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "li.node span.masked"))
    for label in driver.find_elements(By.CSS_SELECTOR, "li.node span.masked"):
        assert re.fullmatch(r"masked: \d{4,} characters cleared", label.text), label.text
        node = label.find_element(By.XPATH, "ancestor::li[1]")
        assert "compaction-proxy cleared this output of read_file(" in node.text


async def test_the_inspector_shows_what_a_masked_message_cleared(
    browser: Any, fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows[MODEL] = WINDOW
    async with proxy_process(inspected_proxy(upstream_url, UNCACHED)) as (_, base):
        async with openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="sk-ui", max_retries=0
        ) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=agent_history(),  # type: ignore[arg-type]
            )
        assert raw.headers["x-compaction-status"] == "masked"
        await asyncio.to_thread(drive_masked, browser, base)
