"""Requests this process sends itself, and the client each one stands for (pure).

A WebSocket on a compacted endpoint is served frame by frame, each frame as an HTTP request to
this very process (``http.socket_endpoint``). Arriving over loopback, every such request would
be named by this process's own address: for a client without a key, its upstream share
(``security.upstream_shares``) would be every keyless socket client's at once, one of them
able to hold the others back. So each frame's request carries the address of the client that
sent the frame, with a MAC under a secret of this process's (``LOOPBACK_CLIENT_HEADER``); its
workers share the secret, since a frame's request may reach any of them. A header the secret
does not vouch for (a client that sent it itself) is ignored: that request keeps its own
address. The header never goes upstream (``security.outbound``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping

from compaction_proxy.config.settings import LOOPBACK_SECRET_ENV
from compaction_proxy.frozen import frozen

LOOPBACK_CLIENT_HEADER = "X-Compaction-Proxy-Client"


@frozen
class LoopbackVouch:
    """Vouches for the client a request to this process stands for, and checks a vouch."""

    secret: bytes

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> LoopbackVouch:
        given = environment.get(LOOPBACK_SECRET_ENV)
        return cls(given.encode() if given else secrets.token_bytes(32))

    def header_for(self, address: str) -> str:
        """The header's value for a request standing for the client at ``address``."""
        return f"{self._mac(address)} {address}"

    def address_in(self, value: str) -> str | None:
        """The address a header's ``value`` vouches for; None when the secret does not."""
        mac, _, address = value.partition(" ")
        given = mac.encode("utf-8", "surrogateescape")  # any text a client may send
        return address if hmac.compare_digest(given, self._mac(address).encode()) else None

    def _mac(self, address: str) -> str:
        text = address.encode("utf-8", "surrogateescape")
        return hmac.new(self.secret, text, hashlib.sha256).hexdigest()
