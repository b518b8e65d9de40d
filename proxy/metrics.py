"""Prometheus metrics: prefix ``compaction_proxy_``, base units, no high-cardinality labels.

Labels are limited to the route (its configured pattern, never the client's model string) and
small closed sets of outcomes; never a conversation id or a key.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

LLM_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

REQUESTS = Counter(
    "compaction_proxy_requests_total",
    "Chat requests by route and outcome.",
    ["route", "outcome"],
)
REQUEST_DURATION = Histogram(
    "compaction_proxy_request_duration_seconds",
    "Time from receiving a chat request to the end of its answer.",
    ["route"],
    buckets=LLM_LATENCY_BUCKETS,
)
UPSTREAM_DURATION = Histogram(
    "compaction_proxy_upstream_duration_seconds",
    "Time the upstream took, from sending the request to the end of its answer.",
    ["route"],
    buckets=LLM_LATENCY_BUCKETS,
)
PROXY_OVERHEAD = Histogram(
    "compaction_proxy_overhead_seconds",
    "Time spent in the proxy before forwarding (parsing, hashing, store, metering).",
    ["route"],
    buckets=OVERHEAD_BUCKETS,
)
STORE_ERRORS = Counter(
    "compaction_proxy_store_errors_total",
    "Store operations that failed; the request was served without the store (bypass).",
    ["operation"],
)


async def metrics_handler(request: web.Request) -> web.Response:
    response = web.Response(body=generate_latest())
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response
