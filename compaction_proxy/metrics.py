"""Prometheus metrics: prefix ``compaction_proxy_``, base units, no high-cardinality labels.

Labels are limited to the route (its configured pattern, never the client's model string) and
small closed sets of outcomes; never a conversation id or a key.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import TypeVar

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)

LLM_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


@functools.cache
def child(metric: M, *label_values: str) -> M:
    """``metric.labels(*label_values)``, in the order the metric names its labels, looked up
    once per label set: every request observes the same few children, and ``labels`` checks
    its arguments and takes a lock on each call. (The label sets are closed, so is the cache.)"""
    return metric.labels(*label_values)


REQUESTS = Counter(
    "compaction_proxy_requests_total",
    "Chat, Responses and Messages requests by route and outcome.",
    ["route", "outcome"],
)
CLIENT_COMPACTIONS = Counter(
    "compaction_proxy_client_compactions_total",
    "Requests in which the client summarizes its own history (its own compaction): compacted "
    "only as far as they must to fit, and a background round for that branch is cancelled.",
    ["route"],
)
FORMATS = ("chat", "responses", "messages")
STATUSES = (
    "none",
    "pruned",
    "masked",
    "compacted",
    "precompacting",
    "recovered",
    "rescued",
    "trimmed",
    "bypass",
)
FORMAT_REQUESTS = Counter(
    "compaction_proxy_format_requests_total",
    "Forwarded requests by the API they came in (chat, responses, messages) and what the proxy "
    "did to them (their X-Compaction-Status).",
    ["format", "status"],
)
SOCKET_SESSIONS = Counter(
    "compaction_proxy_socket_sessions_total",
    "WebSockets opened on an API's endpoint and served frame by frame (each frame is also "
    "counted as a request of its format), by format.",
    ["format"],
)
BYPASSES = Counter(
    "compaction_proxy_bypassed_requests_total",
    "Requests forwarded exactly as the client sent them because the proxy's own work failed, "
    "by cause: store (unreachable) or error (a fault in the proxy, logged with its traceback).",
    ["route", "cause"],
)
CLIENT_DISCONNECTS = Counter(
    "compaction_proxy_client_disconnects_total",
    "Requests whose client went away before the answer was complete.",
    ["route"],
)
PASSTHROUGH_REQUESTS = Counter(
    "compaction_proxy_passthrough_requests_total",
    "Requests to other /v1/ paths, forwarded as sent: by path template, method and outcome "
    "(the upstream's status class, upstream_unavailable, bad_request, client_disconnected, "
    "websocket: a WebSocket session).",
    ["path", "method", "outcome"],
)
PASSTHROUGH_DURATION = Histogram(
    "compaction_proxy_passthrough_duration_seconds",
    "Time from receiving a pass-through request to the end of its answer, by path template.",
    ["path"],
    buckets=LLM_LATENCY_BUCKETS,
)
REQUEST_DURATION = Histogram(
    "compaction_proxy_request_duration_seconds",
    "Time from receiving a chat request to the end of its answer.",
    ["route"],
    buckets=LLM_LATENCY_BUCKETS,
)
UPSTREAM_SHARE_WAITS = Counter(
    "compaction_proxy_upstream_share_waits_total",
    "Requests that waited for one of their own client's to end: the client held its share "
    "of the upstream pool (max_upstream_requests_per_client).",
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
STORE_FALLBACK = Counter(
    "compaction_proxy_store_fallback_total",
    "Conversations carried on without the store (store/fallback.py): loads served from this "
    "process's local copy (served), local work committed to the store once it answered "
    "(restored), or dropped because the conversation moved on there meanwhile (dropped).",
    ["event"],
)
STORE_CIRCUIT_OPEN = Gauge(
    "compaction_proxy_store_circuit_open",
    "1 while this process serves without its store after an outage (a background ping probes "
    "it), else 0; with workers, how many of them do.",
    multiprocess_mode="livesum",
)
SUMMARY_BREAKER_OPEN = Gauge(
    "compaction_proxy_summary_breaker_open",
    "1 while a summarizer's breaker is open or half-open in this process (no request waits for "
    "it; one probes it when its wait has passed), else 0; with workers, how many of them hold "
    "it open.",
    ["summarizer"],
    multiprocess_mode="livesum",
)


PRESSURE = Histogram(
    "compaction_proxy_pressure_ratio",
    "Estimated prompt tokens over the model's context window, before any compaction.",
    ["route"],
    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0),
)
PROMPT_TOKENS_FORWARDED = Counter(
    "compaction_proxy_prompt_tokens_forwarded_total",
    "Estimated prompt tokens forwarded upstream.",
    ["route"],
)
PROMPT_CACHE_KINDS = ("read", "written", "uncached")  # as ``formats.usage.PromptCacheUse``
UPSTREAM_PROMPT_TOKENS = Counter(
    "compaction_proxy_upstream_prompt_tokens_total",
    "Prompt tokens of answered requests as the upstream reported them, by what its prompt "
    "cache did with them (read, written, uncached).",
    ["route", "cache"],
)
TOKENS_SAVED = Counter(
    "compaction_proxy_tokens_saved_total",
    "Estimated prompt tokens not sent upstream because of compaction, counted on every "
    "forwarded request, by mechanism (summary, mask, prune).",
    ["route", "mechanism"],
)
COMPACTIONS = Counter(
    "compaction_proxy_compactions_total",
    "Compaction attempts by trigger, mechanism and outcome.",
    ["trigger", "mechanism", "outcome"],
)
METER_ERROR = Histogram(
    "compaction_proxy_meter_error_ratio",
    "(estimated - upstream prompt tokens) / upstream prompt tokens, for unanchored estimates.",
    buckets=(-0.5, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5),
)
SUMMARY_DURATION = Histogram(
    "compaction_proxy_summary_duration_seconds",
    "Duration of summary calls, by result (ok, failed).",
    ["result"],
    buckets=LLM_LATENCY_BUCKETS,
)
COMPACTION_ERRORS = Counter(
    "compaction_proxy_compaction_errors_total",
    "Unexpected errors inside compaction; the request was forwarded with the surface it had.",
)
OVERFLOW_RECOVERIES = Counter(
    "compaction_proxy_overflow_recoveries_total",
    "Upstream context overflows, by what the proxy did: retried after a committed compaction "
    "changed the request, or passed the upstream's error through unchanged.",
    ["result"],
)
ADMIN_AUTH_FAILURES = Counter(
    "compaction_proxy_admin_auth_failures_total",
    "Admin API requests refused for their token, or while their address was throttled",
)
UNREADABLE_RECORDS = Counter(
    "compaction_proxy_unreadable_records_total",
    "Stored replacement records this version cannot read (another version's, or damaged): "
    "skipped, each counted once while remembered",
)
MASKED_REREADS = Counter(
    "compaction_proxy_masked_rereads_total",
    "Tool calls repeating a call whose output masking had cleared (the same tool and "
    "arguments): the agent ran it again to see it; such outputs are not masked again",
    ["route"],
)
LOG_BYTES_DROPPED = Counter(
    "compaction_proxy_log_bytes_dropped_total",
    "Bytes of conversations' oldest logged events dropped to keep each log within "
    "log_max_bytes (the request and the records still carry what compaction needs)",
)
LOG_PACKS = Counter(
    "compaction_proxy_log_packs_total",
    "Redis log packs tried, by where their events came from (held: logged by this process, "
    "read_back: read back from the stream) and outcome (landed; refused: another replica "
    "packed or dropped the stream's head first; failed: the store did not answer)",
    ["source", "outcome"],
)
UNREADABLE_STATE_FIELDS = Counter(
    "compaction_proxy_unreadable_state_fields_total",
    "Stored conversation state fields this version cannot read (damaged, or another "
    "version's): read as absent, each counted once while remembered",
    ["field"],
)
CHECKPOINT_MISSES = Counter(
    "compaction_proxy_checkpoint_misses_total",
    "Requests long enough for a committed checkpoint of their conversation that shared the "
    "prefix of none (a client rewriting early messages).",
)
OVER_THRESHOLD = Counter(
    "compaction_proxy_over_threshold_requests_total",
    "Requests forwarded at or above their compaction threshold, by why compaction did not "
    "bring them below it (ahead: a checkpoint is being prepared in the background; live_turn, "
    "no_range, summary_failed, cooldown, stopped, ...).",
    ["route", "reason"],
)
PRECOMPACTIONS_IN_FLIGHT = Gauge(
    "compaction_proxy_precompactions_in_flight",
    "Background compaction rounds running in this process.",
    multiprocess_mode="livesum",
)
PRECOMPACTION_DURATION = Histogram(
    "compaction_proxy_precompaction_duration_seconds",
    "Duration of background compaction rounds (select, summarize, commit), by outcome "
    "(committed, summary_failed, busy, ...; error for an unexpected exception).",
    ["outcome"],
    buckets=LLM_LATENCY_BUCKETS,
)
GUARDS = ("tenant_ceiling", "route_ceiling", "recovery_cooldown", "miss_guard")
GUARD_TRIPS = Counter(
    "compaction_proxy_guard_trips_total",
    "Summary calls a money guard stopped, by guard (tenant_ceiling, route_ceiling, "
    "recovery_cooldown, miss_guard).",
    ["guard"],
)
PROACTIVE_STOPPED = Counter(
    "compaction_proxy_proactive_compaction_stopped_total",
    "Conversations whose proactive compaction stopped after repeated checkpoint misses.",
)
STORE_DURATION = Histogram(
    "compaction_proxy_store_operation_duration_seconds",
    "Duration of store operations, by operation.",
    ["operation"],
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5),
)
LEASE_WAITS = Counter(
    "compaction_proxy_lease_waits_total",
    "Requests that waited for another compaction of their conversation, by how it ended.",
    ["result"],
)
LEASE_WAIT_DURATION = Histogram(
    "compaction_proxy_lease_wait_duration_seconds",
    "Time requests spent waiting for another compaction of their conversation.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)


STORE_OPERATIONS = (
    "ping",
    "load",
    "append",
    "record_request",
    "begin_compaction",
    "commit_compaction",
    "end_compaction",
    "read_log",
    "list_conversations",
    "wait_for_lease",
    "renew_lease",
    "shared_secret",
    "take_quota",
    "give_back_quota",
    "claim_objects",
    "object_owners",
)


def initialize_label_sets() -> None:
    """Create the known label combinations at zero, so that rates and dashboards show 0
    rather than nothing before the first event of a kind."""
    for operation in STORE_OPERATIONS:
        STORE_ERRORS.labels(operation=operation)
    for result in ("retried", "passed_through"):
        OVERFLOW_RECOVERIES.labels(result=result)
    for result in ("released", "timed_out"):
        LEASE_WAITS.labels(result=result)
    for guard in GUARDS:
        GUARD_TRIPS.labels(guard=guard)
    for api in FORMATS:
        SOCKET_SESSIONS.labels(format=api)
        for status in STATUSES:
            FORMAT_REQUESTS.labels(format=api, status=status)


def initialize_route_series(routes: Iterable[str]) -> None:
    """Create each configured route's fault series (bypasses, client disconnects) and its
    provider-cache series at zero, so that the dashboard's panels for them read 0, not "no
    data", on a healthy route (or one whose provider reports no cache)."""
    for route in routes:
        for cause in ("store", "error"):
            BYPASSES.labels(route=route, cause=cause)
        CLIENT_DISCONNECTS.labels(route=route)
        for kind in PROMPT_CACHE_KINDS:
            UPSTREAM_PROMPT_TOKENS.labels(route=route, cache=kind)


def exposition_registry() -> CollectorRegistry:
    """The registry to expose: the process's own, or, when the server runs several worker
    processes (``PROMETHEUS_MULTIPROC_DIR`` set before start-up), all workers' combined."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def serve_metrics_port(host: str, port: int) -> None:
    """Expose the metrics on a port of their own too (a background thread)."""
    start_http_server(port, addr=host, registry=exposition_registry())
