"""Pure guards at the edge: which request targets leave ``/v1/``, and how failed admin tokens
throttle one address for a minute and no other."""

from __future__ import annotations

import posixpath
from urllib.parse import quote

import pytest

from compaction_proxy.security.admin_guesses import AdminGuesses
from compaction_proxy.security.paths import leaves_v1
from tests.builders import Clock

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("target", "leaves"),
    [
        ("/v1/chat/completions", False),
        ("/v1/files/file-1/content?x=../y", False),  # the query is not the path
        ("/v1/files/../models", False),
        ("/v1", False),
        ("/v2/models", True),
        ("/v1/..", True),
        ("/v1/%2e%2e/secret", True),
        ("/v1/..%5csecret", True),  # a backslash, read as a slash by some servers
        ("http://example.com/v1/models", True),
        ("*", True),
        # Dot segments in spellings some server reads as ``..``: refused wherever they stand.
        ("/v1/..;/secret", True),
        ("/v1/files/..;x/models", True),
        ("/v1/%252e%252e/secret", True),  # encoded twice
        ("/v1/%25252e%25252e/secret", True),  # three times
        ("/v1/%c0%ae%c0%ae/secret", True),  # overlong UTF-8
        ("/v1/%ef%bc%8e%ef%bc%8e/secret", True),  # fullwidth dots
        ("/v1/\uff0e\uff0e/secret".encode().decode("unicode_escape"), True),  # sent raw
        ("/v1/files%00/x", True),  # NUL
        ("/v1/files/a%0ab", True),  # a control character
        ("/v1/files/file;1", False),  # a semicolon in an id is no dot segment
        ("/v1/files/file%2520one", False),  # a double-encoded space is no dot segment
    ],
)
def test_a_target_leaves_v1_exactly_when_its_normalized_path_does(
    target: str, leaves: bool
) -> None:
    assert leaves_v1(target) is leaves


@given(st.lists(st.sampled_from(["v1", "..", ".", "files", "x", "", "%2e%2e", "%2E."]), max_size=8))
def test_no_target_that_normalizes_outside_v1_is_let_through(segments: list[str]) -> None:
    target = "/v1/" + "/".join(segments)
    decoded = target.replace("%2e", ".").replace("%2E", ".")
    normalized = posixpath.normpath(decoded)
    inside = normalized == "/v1" or normalized.startswith("/v1/")
    assert leaves_v1(target) is not inside
    assert leaves_v1(quote(target, safe="/%")) is not inside


def test_failed_tokens_throttle_one_address_for_a_minute_and_no_other() -> None:
    clock = Clock()
    guesses = AdminGuesses(per_minute=3, clock=clock)
    for _ in range(3):
        assert guesses.throttled("10.0.0.9") is None
        guesses.refused("10.0.0.9")
    wait = guesses.throttled("10.0.0.9")
    assert wait is not None and 1 <= wait <= 60
    assert guesses.throttled("10.0.0.1") is None
    clock.now += 61
    assert guesses.throttled("10.0.0.9") is None
