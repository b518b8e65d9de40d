"""Context windows per model: configured, litellm's bundled map, or learned from the upstream.

Resolution (pure): the configured window, else litellm's ``max_input_tokens``, else unknown.
A limit the upstream itself stated in an overflow error is authoritative: the window used is
never larger than it.
"""

from __future__ import annotations

import logging
from functools import cache

import orjson

from compaction_proxy.lru import LRU
from compaction_proxy.metering.tokenizers import litellm_package_dir

log = logging.getLogger(__name__)


def resolve_window(configured: int | None, mapped: int | None, learned: int | None) -> int | None:
    base = configured if configured is not None else mapped
    if learned is None:
        return base
    return learned if base is None else min(base, learned)


def window_key(model: str, declared: int | None) -> str:
    """The name a learned window is kept under: the model's, or, for requests that declare a
    window of their own, the model's with that window (a limit stated to a 1M-context request
    says nothing of the model's own window, nor the other way)."""
    return model if declared is None else f"{model} [{declared}]"


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
    """Limits the upstream stated in overflow errors, per route, tenant and model, for this
    process.

    Per tenant, because what an error says is not always the upstream's own finding: OpenAI
    echoes an unknown argument's name ("Unrecognized request argument supplied: ..."), so a
    tenant could name one "maximum context length is 1000" and, were the limit kept for the
    model, make the proxy cut every other tenant's requests to a thousand tokens. A tenant's
    overflow teaches that tenant alone; another learns from its own first overflow.

    Model names are the client's: what is kept per name is bounded (``max_models`` of the
    most recently used, per map), and a name is logged as a quoted literal, so no name can
    start a log line of its own."""

    def __init__(self, max_models: int = 4096) -> None:
        self._limits: LRU[tuple[str, str, str], int] = LRU(max_models)
        self._warned: LRU[tuple[str, str], bool] = LRU(max_models)

    @property
    def size(self) -> int:
        """Entries kept, in both maps."""
        return len(self._limits) + len(self._warned)

    def learn(self, route: str, tenant: str, model: str, limit: int) -> None:
        key = (route, tenant, model)
        known = self._limits.get(key)
        if known != limit:
            log.info("upstream stated a context window of %d tokens for %r", limit, model)
        self._limits.put(key, limit if known is None else min(limit, known))

    def get(self, route: str, tenant: str, model: str) -> int | None:
        return self._limits.get((route, tenant, model))

    def warn_unknown_once(self, route: str, model: str) -> None:
        key = (route, model)
        if key not in self._warned:
            self._warned.put(key, True)
            log.warning(
                "no context window known for model %r (route %r): proactive compaction is off "
                "for it; set context_window in the route to enable it",
                model,
                route,
            )
