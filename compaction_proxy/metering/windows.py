"""Context windows per model: configured, litellm's bundled map, or learned from the upstream.

Resolution (pure): the configured window, else litellm's ``max_input_tokens``, else unknown.
A limit the upstream itself stated in an overflow error is authoritative: the window used is
never larger than it.
"""

from __future__ import annotations

import logging
from functools import cache

import orjson

from compaction_proxy.metering.tokenizers import litellm_package_dir

log = logging.getLogger(__name__)


def resolve_window(configured: int | None, mapped: int | None, learned: int | None) -> int | None:
    base = configured if configured is not None else mapped
    if learned is None:
        return base
    return learned if base is None else min(base, learned)


@cache
def model_map() -> dict[str, dict[str, object]]:
    """litellm's bundled model map, read from its package data without importing litellm
    (never the network)."""
    try:
        resource = litellm_package_dir() / "model_prices_and_context_window_backup.json"
        data = orjson.loads(resource.read_bytes())
    except (RuntimeError, FileNotFoundError, orjson.JSONDecodeError) as exc:
        log.warning("litellm's model map is unavailable: %s", type(exc).__name__)
        return {}
    return data if isinstance(data, dict) else {}


def mapped_window(model: str) -> int | None:
    """``max_input_tokens`` from litellm's map, trying the name without a provider prefix."""
    table = model_map()
    for name in (model, model.split("/", 1)[-1]):
        entry = table.get(name)
        if isinstance(entry, dict):
            value = entry.get("max_input_tokens")
            if isinstance(value, int) and value > 0:
                return value
    return None


class LearnedWindows:
    """Limits the upstream stated in overflow errors, per (route, model), for this process."""

    def __init__(self) -> None:
        self._limits: dict[tuple[str, str], int] = {}
        self._warned: set[tuple[str, str]] = set()

    def learn(self, route: str, model: str, limit: int) -> None:
        key = (route, model)
        if self._limits.get(key) != limit:
            log.info("upstream stated a context window of %d tokens for %s", limit, model)
        self._limits[key] = min(limit, self._limits.get(key, limit))

    def get(self, route: str, model: str) -> int | None:
        return self._limits.get((route, model))

    def warn_unknown_once(self, route: str, model: str) -> None:
        key = (route, model)
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "no context window known for model %s (route %s): proactive compaction is off "
                "for it; set context_window in the route to enable it",
                model,
                route,
            )
