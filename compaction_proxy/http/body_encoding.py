"""A request body as its ``Content-Encoding`` says: gzip, deflate, br or zstd (pure).

The server hands bodies over as they came (``auto_decompress`` off, see ``ops.app``): aiohttp's
own decoding checks a deflate body's end inside its HTTP parser and answers a truncated one
itself, in plain text, or not at all when the body came after the headers. Here every coding
fails the same way: ``UndecodableBody`` (a 400), ``DecodedTooLarge`` past the body limit (a
413, checked while decoding, so a small bomb never grows in memory), ``UnknownCoding`` (a 415).
Codings apply in the order the header lists them (RFC 9110, 8.4), so they are undone from the
last; ``identity`` is none.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


class UndecodableBody(ValueError):
    """The body is not in the coding its header names, or it is cut short."""


class DecodedTooLarge(ValueError):
    """Decoded, the body would pass the limit."""


class UnknownCoding(ValueError):
    """A content coding the proxy cannot undo."""


def codings_of(header: str) -> list[str]:
    """The codings a ``Content-Encoding`` header lists, in the order they were applied."""
    return [coding.strip().lower() for coding in header.split(",") if coding.strip()]


def decoded(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """``raw`` with every coding of ``content_encoding`` undone, at most ``limit`` bytes."""
    body = raw
    for coding in reversed(codings_of(content_encoding)):
        if coding == "identity":
            continue
        decode = _DECODERS.get(coding)
        if decode is None:
            raise UnknownCoding(coding)
        body = decode(body, limit)
    return body


def _zlib_stream(data: bytes, limit: int, wbits: int) -> tuple[bytes, bytes]:
    """One zlib, gzip or raw deflate stream from the start of ``data``: its output and what
    follows it."""
    stream = zlib.decompressobj(wbits)
    try:
        out = stream.decompress(data, limit + 1)
    except zlib.error as exc:
        raise UndecodableBody(str(exc)) from exc
    if len(out) > limit or stream.unconsumed_tail:
        raise DecodedTooLarge
    if not stream.eof:
        raise UndecodableBody("the stream is cut short")
    return out, stream.unused_data


def _gzip(raw: bytes, limit: int) -> bytes:
    # A gzip file may hold several members one after the other (RFC 1952, 2.2).
    if not raw:
        return raw
    parts: list[bytes] = []
    rest, size = raw, 0
    while rest.strip(b"\x00"):  # padding after the last member is allowed
        out, rest = _zlib_stream(rest, limit - size, 16 + zlib.MAX_WBITS)
        parts.append(out)
        size += len(out)
    if not parts:
        raise UndecodableBody("no gzip member")
    return b"".join(parts)


def _deflate(raw: bytes, limit: int) -> bytes:
    # "deflate" is the zlib format (RFC 9110, 8.4.1.2), yet some clients send raw deflate;
    # browsers and aiohttp take both, so the proxy does too.
    try:
        out, rest = _zlib_stream(raw, limit, zlib.MAX_WBITS)
    except UndecodableBody:
        out, rest = _zlib_stream(raw, limit, -zlib.MAX_WBITS)
    if rest:
        raise UndecodableBody("data after the end of the stream")
    return out


def _brotli(raw: bytes, limit: int) -> bytes:
    stream = brotli.Decompressor()
    try:
        out = bytes(stream.process(raw, output_buffer_limit=limit + 1))
    except brotli.error as exc:
        raise UndecodableBody(str(exc)) from exc
    if len(out) > limit:
        raise DecodedTooLarge
    if not stream.is_finished():
        raise UndecodableBody("the stream is cut short")
    return out


def _zstd(raw: bytes, limit: int) -> bytes:
    # A zstd stream may hold several frames one after the other.
    parts: list[bytes] = []
    rest, size = raw, 0
    while rest:
        frame = zstd.ZstdDecompressor()
        try:
            out = frame.decompress(rest, limit - size + 1)
        except zstd.ZstdError as exc:
            raise UndecodableBody(str(exc)) from exc
        size += len(out)
        if size > limit or not (frame.eof or frame.needs_input):
            raise DecodedTooLarge
        if not frame.eof:
            raise UndecodableBody("the stream is cut short")
        parts.append(out)
        rest = frame.unused_data
    return b"".join(parts)


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip,
    "x-gzip": _gzip,
    "deflate": _deflate,
    "br": _brotli,
    "zstd": _zstd,
}
