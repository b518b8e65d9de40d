"""Whether the proxy makes the providers' own compaction answers for a route (pure).

``native_compaction`` on a route: ``serve`` (the proxy answers ``/v1/responses/compact`` and a
Responses ``compaction_trigger`` itself, from its own engine), ``relay`` (both go to the
upstream untouched), or ``auto``, the default: relayed to the upstreams known to offer them,
served for every other (vLLM, Ollama, llama.cpp, gateways, Azure deployments without them),
where they would fail. ``auto`` never serves what the upstream itself offers.
"""

from __future__ import annotations

from yarl import URL

from compaction_proxy.config.settings import Route

# Hosts whose APIs have them: OpenAI's /responses/compact, compaction_trigger and
# context_management; Anthropic's context_management edits (under their beta headers).
OFFERS_COMPACTION = frozenset({"api.openai.com", "api.anthropic.com"})


def serves_compaction(route: Route) -> bool:
    """Whether compaction requests on ``route`` are answered by the proxy."""
    if route.native_compaction != "auto":
        return route.native_compaction == "serve"
    return URL(route.base).host not in OFFERS_COMPACTION
