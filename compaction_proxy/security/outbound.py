"""What of a client's request goes upstream (pure): its headers, less this hop's own and with
the credentials the route decides, plus the hop marker; and the URL, with the client's query
string as it encoded it.

Credentials go only where the route says (DESIGN.md §11, "Keys stay where they belong"): a
route key replaces the client's, and a client key for this proxy is never sent on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from multidict import CIMultiDict
from yarl import URL

from compaction_proxy.security.credentials import CREDENTIAL_HEADERS
from compaction_proxy.security.loopback import LOOPBACK_CLIENT_HEADER

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",  # not standard, still sent by some clients
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# A body the proxy read is sent up decoded (``intake.read_body``): its old length and encoding
# no longer describe it (a body relayed unread puts its encoding back, ``passthrough``).
# An expectation (``Expect: 100-continue``) was met when the proxy read the body: sent on, it
# would only hold the body back a round trip while the upstream says "continue".
_NOT_FORWARDED_UP = HOP_BY_HOP | {
    "host",
    "content-length",
    "accept-encoding",
    "content-encoding",
    "expect",
    LOOPBACK_CLIENT_HEADER.lower(),  # this process's own (``security.loopback``)
}
# Sent on every request the proxy makes; a request arriving with it came from a proxy (this
# one, looped back by configuration) and is refused with 508 (see ``security.self_forwarding``).
HOP_HEADER = "X-Compaction-Proxy-Hop"


def upstream_headers(
    client_headers: Mapping[str, str],
    api_key_env: str | None,
    *,
    proxy_keys: bool = False,
    anthropic: bool = False,
) -> CIMultiDict[str]:
    """The client's headers, minus hop-by-hop ones, plus the hop marker; a route key replaces
    the client's credentials, as ``Authorization: Bearer`` (as ``x-api-key`` for an
    ``anthropic``-format request). With ``proxy_keys`` the client's credential is a key for
    this proxy, never sent on."""
    headers = without(client_headers, _NOT_FORWARDED_UP)
    if proxy_keys:
        for name in CREDENTIAL_HEADERS:
            headers.popall(name, None)
    if api_key_env:
        route_key = os.environ.get(api_key_env)
        if route_key:
            for name in CREDENTIAL_HEADERS:
                headers.popall(name, None)
            if anthropic:
                headers["x-api-key"] = route_key
            else:
                headers["Authorization"] = f"Bearer {route_key}"
    headers[HOP_HEADER] = "1"
    return headers


def is_anthropic_path(path: str) -> bool:
    """Whether a ``/v1/`` path is of Anthropic's Messages API (``/v1/messages...``)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def speaks_anthropic(path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is of Anthropic's API: a Messages path, or the model list (a path
    both APIs share) asked with the ``anthropic-version`` header every Anthropic client
    sends."""
    if is_anthropic_path(path):
        return True
    models = path == "/v1/models" or path.startswith("/v1/models/")
    return models and "anthropic-version" in headers


def upstream_url(base: str, path: str, query: str = "") -> URL:
    """``base`` + ``path``, with the client's query string (``api-version=...``, a gateway's
    parameters) as the client encoded it."""
    return URL(f"{base}{path}?{query}" if query else f"{base}{path}", encoded=True)


def _named_by_connection(headers: Mapping[str, str]) -> frozenset[str]:
    """Headers the ``Connection`` header names: this hop's alone (RFC 9110, 7.6.1)."""
    listed = headers.get("Connection")
    if not listed:
        return frozenset()
    return frozenset(token.strip().lower() for token in listed.split(","))


def without(headers: Mapping[str, str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """A copy of ``headers`` (order and repeats kept) less ``dropped`` and those the
    ``Connection`` header names. Copied whole, then pruned of the names present, found in C:
    a comparison in Python per header, or a removal per name ``dropped`` lists, cost more."""
    copy: CIMultiDict[str] = CIMultiDict(headers)
    present = dropped.intersection(map(str.lower, headers.keys()))
    for name in present | _named_by_connection(headers):
        copy.popall(name, None)
    return copy
