"""The proxy must never forward to itself.

A shell set up for clients (``OPENAI_BASE_URL`` pointing at the proxy) is also the proxy's own
environment, and ``OPENAI_BASE_URL`` is one of the names its upstream is read from: every
request would then come back in, again and again. Two guards: start-up refuses an upstream at
the proxy's own listen address, and every request the proxy sends carries ``HOP_HEADER``, so a
request arriving with it (through a name or a balancer start-up could not see through) is
answered 508 instead of being forwarded once more.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from compaction_proxy.config.settings import Settings
from compaction_proxy.security.credentials import ConfigProblem, all_routes

_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def _own_names(listen_host: str) -> frozenset[str]:
    if listen_host in _WILDCARDS:
        return _LOOPBACK | _WILDCARDS | {socket.gethostname().lower()}
    names = {listen_host.lower()}
    if listen_host in _LOOPBACK:
        names |= _LOOPBACK
    return frozenset(names)


def _base_setting(setting: str) -> str:
    if setting in ("upstream", "anthropic"):
        return f"{setting}_base_url"
    return f"{setting}.base_url"


def self_loop_problems(settings: Settings) -> list[ConfigProblem]:
    """Routes whose upstream is this proxy's own listen address."""
    own = _own_names(settings.host)
    problems = []
    for setting, route in all_routes(settings):
        parts = urlsplit(route.base)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = (parts.hostname or "").lower()
        if port == settings.port and host in own:
            problems.append(
                ConfigProblem(
                    _base_setting(setting),
                    f"{route.base} is this proxy's own address ({settings.host}:"
                    f"{settings.port}): every request would come back to it. Is "
                    "OPENAI_BASE_URL set for clients in the proxy's environment?",
                )
            )
    return problems
