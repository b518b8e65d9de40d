"""Figures tests print after the run: lines kept by title, in the process that ran the test.

Under pytest-xdist each worker holds its own; ``tests/conftest.py`` sends a worker's lines to
the controller when the worker ends, and the controller prints them all in the summary.
"""

from __future__ import annotations

from collections import defaultdict

# The transcript replays: raw against forwarded tokens, one line per replay.
TRANSCRIPT_REPLAY = "transcript replay through the proxy"
# The real agents: the proxy's summary calls when an agent compacts on its own.
REAL_AGENTS = "real agents through the proxy"

REPORTS: defaultdict[str, list[str]] = defaultdict(list)


def report(title: str, line: str) -> None:
    """Print ``line`` under ``title`` in the run's summary."""
    REPORTS[title].append(line)
