"""Client keys: who may spend the upstream keys the proxy holds.

Once a route injects its own key (``api_key_env``), anyone who reaches the proxy could spend
it, and every keyless client would share one tenant. So the proxy then requires each client to
authenticate with a key of its own, issued by the operator (``compaction-proxy client-key
new``). Keys are kept at rest only as SHA-256 digests: a file of lines ``<hex digest> [name]``
(``client_keys_file``) and/or the ``client_key_digests`` setting. Each key is its own tenant.
A client key is a proxy credential: it is never forwarded upstream.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from compaction_proxy.config.settings import ConfigError, Settings

KEY_PREFIX = "cpk-"
_HEX_DIGEST_LENGTH = 64


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _valid_digest(text: str) -> bool:
    return len(text) == _HEX_DIGEST_LENGTH and all(c in "0123456789abcdef" for c in text)


def parse_digest_lines(text: str, source: str) -> set[str]:
    """Digests from ``<hex digest> [name]`` lines; blank lines and ``#`` comments skipped."""
    digests: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        digest = stripped.split()[0].lower()
        if not _valid_digest(digest):
            raise ConfigError(f"{source}:{number}: not a SHA-256 hex digest: {digest[:16]}…")
        digests.add(digest)
    return digests


def load_client_key_digests(settings: Settings) -> frozenset[str]:
    """Every configured client key digest; raises ConfigError for a malformed one."""
    digests = parse_digest_lines("\n".join(settings.client_key_digests), "client_key_digests")
    if settings.client_keys_file:
        path = Path(settings.client_keys_file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"client_keys_file: cannot read {path}: {exc}") from exc
        digests |= parse_digest_lines(text, str(path))
    return frozenset(digests)


def holds_upstream_keys(settings: Settings) -> bool:
    catch_alls = [settings.default_route, settings.anthropic_route]
    return any(route.api_key_env for route in [*settings.routes, *catch_alls])


class ClientKeys:
    """The configured set; ``required`` when any route holds an upstream key."""

    def __init__(self, digests: frozenset[str], required: bool) -> None:
        self.digests = digests
        self.required = required or bool(digests)

    def allows(self, api_key: str) -> bool:
        return bool(api_key) and digest_of(api_key) in self.digests
