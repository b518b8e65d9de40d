"""Request targets that must not be relayed (pure).

aiohttp routes a request on its path as it came, and the relay sends that path on as the client
encoded it, with the route's key attached. A path whose dot segments, percent-encoded or not,
climb out of ``/v1/`` would then reach another path of the upstream under the proxy's key; an
absolute-form request line names a host of the client's choosing. Both are refused before
anything is forwarded.

Upstreams differ in how they read a segment, so a dot segment is honoured only in the spelling
every server reads alike: ``.`` or ``..``, percent-encoded once at most. A segment some server
would read as a dot segment in another spelling is refused wherever it stands: a servlet path
parameter (``..;x``), a second round of encoding (``%252e``), an overlong UTF-8 dot
(``%c0%ae``), a fullwidth dot (``U+FF0E``), as is any control character (``%00``). No client has a
reason to send one; a server that reads it as ``..`` would otherwise see another path than the
proxy checked.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from urllib.parse import unquote, unquote_to_bytes

_NEEDS_A_LOOK = re.compile(r"[.%\\;]|//")
_DECODINGS = 4  # rounds of percent-decoding a server stack might apply, one after another
_DOTS = frozenset({".", ".."})


def leaves_v1(raw_target: str) -> bool:
    """Whether a request target is refused: not an origin-form path that stays under ``/v1/``
    once normalized as a server would (percent-decoded once, backslashes read as slashes, dot
    segments resolved), or holding a dot segment in a spelling servers read differently, or a
    control character."""
    path = raw_target.partition("?")[0]
    if not path.startswith("/"):
        return True  # absolute-form (a URL) or asterisk-form
    if path.isascii() and path.isprintable() and _NEEDS_A_LOOK.search(path) is None:
        return not (path == "/v1" or path.startswith("/v1/"))
    once = unquote(path, errors="surrogateescape").replace("\\", "/")
    if not once.isprintable() or any(_disguised_dots(s) for s in once.split("/")):
        return True
    normalized = posixpath.normpath(once)
    return not (normalized == "/v1" or normalized.startswith("/v1/"))


def _disguised_dots(segment: str) -> bool:
    """Whether a once-decoded segment is not a plain dot segment, yet some server would read
    it as one (or it cannot be read as text at all)."""
    if segment in _DOTS:
        return False
    text = segment
    for _ in range(_DECODINGS):
        try:
            decoded = unquote_to_bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            return True  # an overlong or broken UTF-8 sequence: no client's path
        if not decoded.isprintable():
            return True
        if decoded == text:
            break
        text = decoded
    core = unicodedata.normalize("NFKC", text).replace("\\", "/").split(";", 1)[0].strip()
    return core in _DOTS or any(part in _DOTS for part in core.split("/"))
