"""``frozen``: compares and hashes as a frozen dataclass does; the type checker refuses every
assignment to its fields, which is what keeps its instances immutable."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from mypy import api as mypy_api

from compaction_proxy.frozen import frozen

REPO = Path(__file__).resolve().parents[2]


@frozen
class _Point:
    x: int
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _FrozenPoint:
    x: int
    tags: tuple[str, ...] = ()


@frozen(eq=False)
class _Parse:
    raw: bytes


def test_a_frozen_record_compares_and_hashes_as_a_frozen_dataclass() -> None:
    for x, tags in [(1, ()), (2, ("a",)), (-3, ("a", "b"))]:
        assert _Point(x, tags) == _Point(x, tags)
        assert hash(_Point(x, tags)) == hash(_FrozenPoint(x, tags))
        assert (
            repr(_Point(x, tags)).split("(", 1)[1] == repr(_FrozenPoint(x, tags)).split("(", 1)[1]
        )
    assert _Point(1) != _Point(2)
    assert len({_Point(1), _Point(1), _Point(2)}) == 2
    assert dataclasses.replace(_Point(1, ("a",)), x=5) == _Point(5, ("a",))


def test_a_frozen_record_without_eq_is_compared_and_hashed_by_identity() -> None:
    one, other = _Parse(b"{}"), _Parse(b"{}")
    assert one != other
    assert one == one
    assert hash(one) == object.__hash__(one)
    assert len({one, other}) == 2


def test_the_type_checker_refuses_an_assignment_to_a_frozen_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from compaction_proxy.frozen import frozen\n\n\n"
        "@frozen\nclass Kept:\n    x: int\n\n\n"
        "@frozen(eq=False)\nclass Parsed:\n    raw: bytes\n\n\n"
        "kept = Kept(1)\nkept.x = 2\nparsed = Parsed(b'')\nparsed.raw = b'{}'\n"
        "Kept('one')\n"
    )
    monkeypatch.setenv("MYPYPATH", str(REPO))
    out, _, status = mypy_api.run(
        [
            "--strict",
            "--no-incremental",
            "--config-file",
            "",
            "--follow-imports",
            "silent",
            str(probe),
        ]
    )
    assert status == 1, out
    assert 'Property "x" defined in "Kept" is read-only' in out
    assert 'Property "raw" defined in "Parsed" is read-only' in out
    assert 'incompatible type "str"; expected "int"' in out
    assert "Found 3 errors" in out


def test_no_module_of_the_package_declares_a_runtime_frozen_dataclass() -> None:
    """Immutable data is ``@frozen`` throughout: one idiom, and no frozen constructor on the
    request path."""
    package = REPO / "compaction_proxy"
    declared = re.compile(r"^\s*@(dataclasses\.)?dataclass\([^)]*frozen\s*=\s*True", re.MULTILINE)
    found = [
        str(path.relative_to(REPO))
        for path in sorted(package.rglob("*.py"))
        if declared.search(path.read_text(encoding="utf-8"))
    ]
    assert found == []
