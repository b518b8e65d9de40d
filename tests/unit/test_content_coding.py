"""Request bodies decoded as their ``Content-Encoding`` says, within a limit (pure: tables and
round trips)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from compaction_proxy.http.body_encoding import (
    DecodedTooLarge,
    UndecodableBody,
    UnknownCoding,
    codings_of,
    decoded,
)
from tests.encodings import ENCODINGS, compressed, zstd

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

LIMIT = 1 << 20
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=4_000), encoding=st.sampled_from(ENCODINGS))
def test_every_coding_round_trips(raw: bytes, encoding: str) -> None:
    assert decoded(compressed(raw, encoding), encoding, LIMIT) == raw


@pytest.mark.parametrize(
    ("header", "codings"),
    [
        ("", []),
        ("gzip", ["gzip"]),
        (" GZIP , br", ["gzip", "br"]),
        ("identity", ["identity"]),
        ("gzip,,zstd", ["gzip", "zstd"]),
    ],
)
def test_the_header_lists_codings_in_the_order_they_were_applied(
    header: str, codings: list[str]
) -> None:
    assert codings_of(header) == codings


def test_codings_are_undone_from_the_last_applied() -> None:
    twice = compressed(compressed(BODY, "gzip"), "br")
    assert decoded(twice, "gzip, br", LIMIT) == BODY
    assert decoded(BODY, "identity", LIMIT) == BODY
    assert decoded(compressed(BODY, "gzip"), "x-gzip", LIMIT) == BODY


@pytest.mark.parametrize(
    ("raw", "encoding"),
    [
        (
            gzip.compress(b"one ", mtime=0) + gzip.compress(b"two", mtime=0),
            "gzip",
        ),  # members one after another
        (gzip.compress(BODY, mtime=0) + b"\x00" * 8, "gzip"),  # padding after the last member
        (zlib.compress(BODY)[2:-4], "deflate"),  # raw deflate, as some clients send it
        (zstd.compress(b"one ") + zstd.compress(b"two"), "zstd"),  # frames one after another
    ],
)
def test_what_real_clients_send_besides_the_textbook_form_is_read(
    raw: bytes, encoding: str
) -> None:
    assert decoded(raw, encoding, LIMIT) in (BODY, b"one two")


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("damage", ["truncated", "junk", "one byte"])
def test_a_body_that_is_not_its_coding_or_is_cut_short_is_undecodable(
    encoding: str, damage: str
) -> None:
    packed = compressed(BODY * 50, encoding)
    raw = {"truncated": packed[: len(packed) // 2], "junk": BODY, "one byte": b"\xe9"}[damage]
    with pytest.raises(UndecodableBody):
        decoded(raw, encoding, LIMIT)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_body_that_decodes_past_the_limit_is_too_large_however_small_it_came(
    encoding: str,
) -> None:
    bomb = compressed(b"\x00" * (8 * LIMIT), encoding)
    assert len(bomb) < LIMIT // 8
    with pytest.raises(DecodedTooLarge):
        decoded(bomb, encoding, LIMIT)
    assert len(decoded(bomb, encoding, 8 * LIMIT)) == 8 * LIMIT  # exactly at the limit


@pytest.mark.parametrize("header", ["compress", "x-unknown", "gzip, lzma"])
def test_a_coding_the_proxy_does_not_know_is_refused_as_such(header: str) -> None:
    with pytest.raises(UnknownCoding):
        decoded(compressed(BODY, "gzip"), header, LIMIT)
