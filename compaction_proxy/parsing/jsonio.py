"""JSON in and out, losslessly where it matters.

orjson is fast but narrower than JSON: it parses integers beyond 64 bits as floats (silently
changing them) and refuses to serialize them. A client's body must reach the upstream as it
meant it, so those rare documents go through the standard library instead (``loads``). A client
body is first read with orjson alone (``loads_fast``): reading is all most requests need, and
only a body the proxy sends on rewritten is checked for such integers, then read again
losslessly (``ClientRequest.lossless_body``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

# 19 digits in a row may be an integer orjson cannot hold (the signed 64-bit limit has 19).
# Found by mapping every digit to "d" and everything else to a space, then one ``find``: ten
# times faster than a regular expression over a large body.
_DIGITS = bytes(ord("d") if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_RUN = b"d" * 19
# Scanned a window at a time (overlapping by a run's length, less one): each window is one
# C call that holds the interpreter for about a millisecond, so a 30 MB body scanned in a
# worker thread lets the event loop in between windows.
_WINDOW = 1024 * 1024


def may_hold_a_big_integer(raw: bytes, start: int = 0) -> bool:
    """Whether ``raw[start:]`` holds 19 digits in a row (a linear scan: callers scan only
    what is new, see ``Lineage.clean_bytes``)."""
    overlap = len(_RUN) - 1
    return any(
        raw[begin : begin + _WINDOW + overlap].translate(_DIGITS).find(_RUN) >= 0
        for begin in range(start, len(raw), _WINDOW)
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is infinity when parsed as double")
    return value


def loads(raw: bytes | str) -> Any:
    """Parse a JSON document; raises ``ValueError`` (or ``RecursionError``) when it is not one.

    Both parsers accept the same language: the standard library's extensions (``NaN``,
    ``Infinity``, numbers that overflow to infinity) are refused as orjson refuses them."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if may_hold_a_big_integer(data):
        return _standard_loads(raw)
    return loads_fast(raw)


def loads_fast(raw: bytes | str) -> Any:
    """Parse with orjson: integers beyond 64 bits come back as floats. For reading only; what
    is sent on must come from ``loads``. Raises ``ValueError`` when it is not JSON.

    A lone surrogate escape (``"\\ud83d"``: a JavaScript client's string cut in the middle of an
    emoji) is valid JSON that orjson refuses; some providers take it, so a document orjson
    refuses is read again by the standard library when it holds an escape (if that fails too,
    orjson's error stands), its integers beyond 64 bits as floats all the same."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as refused:
        if b"\\u" not in (raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw):
            raise
        try:
            # Integers as orjson reads them, so that a document reads the same whichever
            # parser reads it: a body parsed from a remembered one parses its new messages
            # alone, which orjson may take while it refuses the whole body.
            return _standard_loads(raw, parse_int=_int_as_orjson_reads_it)
        except (ValueError, RecursionError):
            raise refused from None


def _standard_loads(raw: bytes | str, parse_int: Callable[[str], Any] = int) -> Any:
    # Bytes decoded strictly: the standard library's own reading of bytes lets surrogates
    # encoded in UTF-8 through, which orjson refuses (a body would then parse or not
    # depending on whether an unrelated escape sent it here).
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    return json.loads(
        text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=parse_int
    )


def _int_as_orjson_reads_it(text: str) -> int | float:
    """An integer within 64 bits (signed, or unsigned), else the float orjson makes of it."""
    value = int(text)
    if -(2**63) <= value < 2**64:
        return value
    return _finite_float(text)


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact UTF-8 JSON; sorted keys when asked (the canonical form for hashing)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except TypeError:
        # Integers beyond 64 bits, or nesting deeper than orjson's limit.
        compact = (",", ":")
        text = json.dumps(value, sort_keys=sort_keys, ensure_ascii=False, separators=compact)
        try:
            return text.encode()
        except UnicodeEncodeError:
            # A lone surrogate (valid as a JSON escape, not as UTF-8): keep it escaped.
            return json.dumps(value, sort_keys=sort_keys, separators=compact).encode()
