"""The quickstart as the README and the getting-started page write it.

The README's shell block runs as written (the fake upstream in the background, then the proxy),
on free ports instead of 9000 and 8080; then each page's Python block runs against them,
unchanged but for the port, and what it prints is checked against what the prose says.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path

import pytest

from tests.processes import free_port, wait_until_ready

pytest.importorskip("openai")

ROOT = Path(__file__).parents[2]
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)
DEMO_HEADING = "## See it compact"


def fenced(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


def demo_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(DEMO_HEADING)
    return readme[start : readme.index("\n## ", start + 1)]


@pytest.fixture
async def quickstart() -> AsyncIterator[str]:
    """The demo's shell block, run by bash as written but for its ports; yields the proxy's
    base URL, and stops the fake and the proxy (the block's whole process group) after."""
    (commands,) = fenced(demo_section(), "sh")
    fake_port, proxy_port = free_port(), free_port()
    assert "--port 9000" in commands and "127.0.0.1:9000" in commands
    assert commands.rstrip().endswith("compaction-proxy serve")
    script = commands.replace("9000", str(fake_port)).rstrip() + f" --port {proxy_port}\n"
    bin_dir = str(Path(sys.executable).parent)  # `python` and `compaction-proxy` of this env
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", script, env=env, start_new_session=True
    )
    base = f"http://127.0.0.1:{proxy_port}"
    try:
        await wait_until_ready(f"{base}/healthz")
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)


async def run_snippet(code: str, base: str) -> list[str]:
    assert "127.0.0.1:8080" in code
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code.replace("127.0.0.1:8080", base.removeprefix("http://")),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 240)
    assert process.returncode == 0, err.decode()[-3000:]
    return out.decode().splitlines()


async def test_the_readme_demo_compacts_where_its_prose_says(quickstart: str) -> None:
    section = demo_section()
    (snippet,) = fenced(section, "python")
    rows = [line.split() for line in await run_snippet(snippet, quickstart)]
    assert [int(row[0]) for row in rows] == list(range(30))
    statuses = [row[1] for row in rows]
    tokens = [int(row[2]) for row in rows]

    said = re.search(r"At turn (\d+) the status says `precompacting`", section)
    compacted_from = re.search(r"from turn (\d+) `compacted`", section)
    assert said and compacted_from, "the prose names the turns it shows"
    first = int(said.group(1))
    assert statuses.index("precompacting") == first
    assert set(statuses[:first]) == {"none"}
    # What goes upstream: the figures the prose gives (thousands, rounded), falling back after
    # each checkpoint, never reaching the 16k window.
    figures = re.search(
        r"([\d.]+)k right after it, growing to ([\d.]+)k\s+before the next checkpoint takes it "
        r"back to ([\d.]+)k \(turn (\d+)\)",
        section,
    )
    assert figures, "the prose gives what goes upstream after a checkpoint"
    # From the named turn on, every request carries a checkpoint. On a host too busy to
    # write the background checkpoint within the demo's pause between turns, it lands a
    # turn or two later, and the figures the prose gives for that run cannot be read off
    # this one: only what holds whenever the checkpoint lands is checked then.
    compacted = int(compacted_from.group(1))
    landed = statuses.index("compacted")
    assert compacted <= landed <= compacted + 2, statuses
    assert set(statuses[landed:]) <= {"compacted", "precompacting"}
    assert max(tokens) < 16_000
    assert tokens[landed] < tokens[first] / 2
    assert any(later < earlier for earlier, later in pairwise(tokens[landed:]))
    if landed != compacted:
        return
    after, peak, again, turn = (float(figures.group(i)) for i in range(1, 5))
    assert round(tokens[compacted] / 1000, 1) == after
    assert round(max(tokens[compacted : int(turn)]) / 1000) == peak
    assert round(tokens[int(turn)] / 1000, 1) == again


async def test_the_getting_started_calls_print_their_answers(quickstart: str) -> None:
    (snippet,) = fenced((ROOT / "docs" / "getting-started.md").read_text(), "python")
    lines = await run_snippet(snippet, quickstart)
    assert len(lines) == 3 and all(line.strip() for line in lines), lines
