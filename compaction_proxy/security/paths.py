"""Request targets that must not be relayed (pure).

aiohttp routes a request on its path as it came, and the relay sends that path on as the client
encoded it, with the route's key attached. A path whose dot segments, percent-encoded or not,
climb out of ``/v1/`` would then reach another path of the upstream under the proxy's key; an
absolute-form request line names a host of the client's choosing. Both are refused before
anything is forwarded.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

_NEEDS_A_LOOK = (".", "%", "\\", "//")


def leaves_v1(raw_target: str) -> bool:
    """Whether a request target is not an origin-form path that stays under ``/v1/`` once
    normalized as a server would: percent-decoded once, backslashes read as slashes, dot
    segments resolved."""
    path = raw_target.partition("?")[0]
    if not path.startswith("/"):
        return True  # absolute-form (a URL) or asterisk-form
    if not any(mark in path for mark in _NEEDS_A_LOOK):
        return not (path == "/v1" or path.startswith("/v1/"))
    normalized = posixpath.normpath(unquote(path).replace("\\", "/"))
    return not (normalized == "/v1" or normalized.startswith("/v1/"))
