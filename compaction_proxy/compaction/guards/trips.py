"""Money guards that trip: counted every time, logged once per guard and scope.

A guard (a summary ceiling, the miss guard, the recovery cooldown, a summarizer breaker) that
stops a summary call keeps a misbehaving client from running up a bill; an operator needs to
see that it happened, not one log line per request while it keeps happening.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from compaction_proxy.metrics import GUARD_TRIPS

log = logging.getLogger(__name__)

_LOGGED_MAX = 10_000
_logged: OrderedDict[tuple[str, str], None] = OrderedDict()


def trip(guard: str, scope: str, detail: str) -> None:
    """Count one trip of ``guard`` for ``scope`` (a tenant, a route, a conversation); log the
    first for each pair (bounded memory: the oldest pairs are forgotten first)."""
    GUARD_TRIPS.labels(guard=guard).inc()
    key = (guard, scope)
    if key in _logged:
        return
    _logged[key] = None
    if len(_logged) > _LOGGED_MAX:
        _logged.popitem(last=False)
    log.warning("%s tripped for %s: %s", guard, scope, detail)
