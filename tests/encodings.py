"""Request bodies compressed as clients send them (``Content-Encoding``)."""

from __future__ import annotations

import gzip
import sys
import zlib

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

ENCODINGS = ("gzip", "deflate", "br", "zstd")
__all__ = ["ENCODINGS", "compressed", "zstd"]


def compressed(raw: bytes, encoding: str) -> bytes:
    """``raw`` in one of ``ENCODINGS`` (zstd at level 3, as Codex sends it)."""
    if encoding == "gzip":
        return gzip.compress(raw)
    if encoding == "deflate":
        return zlib.compress(raw)
    if encoding == "br":
        return bytes(brotli.compress(raw))
    if encoding == "zstd":
        return zstd.compress(raw, 3)
    raise ValueError(f"not a content coding these tests send: {encoding}")
