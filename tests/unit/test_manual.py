"""The README reads in five minutes and the manual builds: every page in its navigation, every
link and anchor resolved (``mkdocs build --strict``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_proxy.ops.reference import PAGE_MAKERS

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_stays_short_and_links_only_to_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).exists(), target


def test_the_manual_builds_with_every_link_resolved(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the test extra installs it)")
    pytest.importorskip("material", reason="mkdocs-material is not installed")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "native-compaction" / "index.html").exists()


@pytest.mark.parametrize("page", sorted(PAGE_MAKERS))
def test_the_reference_pages_are_what_the_code_generates(page: str) -> None:
    """Regenerate with ``python -m compaction_proxy.ops.reference`` when this fails."""
    assert (ROOT / "docs" / "reference" / page).read_text() == PAGE_MAKERS[page](ROOT)
