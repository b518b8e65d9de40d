"""Whose key goes where: checked once at start-up, applied to every summary call (pure).

A client's credentials go only to the upstream its request was routed to. A route that names
``api_key_env`` sends that key instead, so the variable must hold one: an unset variable would
otherwise quietly forward the client's own key to that route's host. A summary model routed to
another host than the request's route must bring its own key for the same reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from compaction_proxy.config.policy import resolve_policy, route_for
from compaction_proxy.config.settings import Route, Settings
from compaction_proxy.frozen import frozen

# The client headers a summary call carries: credentials (when the summary goes where the
# request went), the account headers that decide billing, and nothing else. A summary call is
# the proxy's own request; tracing ids, cookies or custom headers of the client stay behind.
# A client's credentials: OpenAI's bearer token, Azure's api-key, Anthropic's x-api-key.
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})

SUMMARY_HEADERS = frozenset(
    {
        "authorization",
        "api-key",
        "x-api-key",
        "openai-organization",
        "openai-project",
        "anthropic-version",
        "anthropic-beta",
        "user-agent",
    }
)


def key_source(route: Route) -> str:
    """What authenticates requests on ``route``: the client's key or the route's variable."""
    return f"route ({route.api_key_env})" if route.api_key_env else "client"


@frozen
class ConfigProblem:
    """A setting that would make the proxy send a request where it must not go."""

    setting: str
    message: str

    def __str__(self) -> str:
        return f"{self.setting}: {self.message}"


def all_routes(settings: Settings) -> list[tuple[str, Route]]:
    """Every route with the setting that configures it, the catch-alls last."""
    named = [(f"routes[{i}]", route) for i, route in enumerate(settings.routes)]
    return [*named, ("anthropic", settings.anthropic_route), ("upstream", settings.default_route)]


def _key_setting(setting: str) -> str:
    if setting in ("upstream", "anthropic"):
        return f"{setting}_api_key_env"
    return f"{setting}.api_key_env"


def _models_of(route: Route) -> Iterator[str]:
    yield route.model
    yield from route.models


def credential_problems(settings: Settings, environ: Mapping[str, str]) -> list[ConfigProblem]:
    """Everything that would send a key where it does not belong, or no key at all."""
    problems: list[ConfigProblem] = []
    for setting, route in all_routes(settings):
        env = route.api_key_env
        if env is not None and not environ.get(env, "").strip():
            problems.append(
                ConfigProblem(
                    _key_setting(setting),
                    f"names {env}, which is unset or empty: the client's own key would be "
                    f"sent to {route.base} instead",
                )
            )
        if setting == "anthropic":
            continue  # matches no model of its own: the routes it stands behind are checked
        for model in _models_of(route):
            summary_model = resolve_policy(settings, route, model).summary_model
            if summary_model is None:
                continue
            summary_route = route_for(settings, summary_model)
            if summary_route.base != route.base and not summary_route.api_key_env:
                problems.append(
                    ConfigProblem(
                        f"{setting}: summary_model {summary_model}",
                        f"is served by {summary_route.base}, another host than "
                        f"{route.base}, and its route has no api_key_env: client keys are "
                        "never sent to another host, so that route needs its own key",
                    )
                )
    return problems


def summary_call_headers(
    client_headers: Mapping[str, str], request_route: Route, summary_route: Route
) -> dict[str, str]:
    """The client headers a summary call may carry (see ``SUMMARY_HEADERS``); the client's
    credentials only when the summary goes to the host its request went to."""
    same_host = summary_route.base == request_route.base
    return {
        name: value
        for name, value in client_headers.items()
        if name.lower() in SUMMARY_HEADERS and (same_host or name.lower() not in CREDENTIAL_HEADERS)
    }


def summary_call_query(query: str, request_route: Route, summary_route: Route) -> str:
    """The client's query string for a summary call (``api-version=...``): on the terms of
    its credentials, since a query may carry a key (``?key=...``)."""
    return query if summary_route.base == request_route.base else ""


def summary_call_fields(
    body: Mapping[str, Any],
    fields: Iterable[tuple[str, type]],
    request_route: Route,
    summary_route: Route,
) -> dict[str, Any]:
    """The fields of the client's ``body`` naming its end user (``fields``: each name with the
    type the API takes) that its summary call carries: on the terms of its credentials, to the
    host its request went to alone (another's API may not take them); a value of another type
    (which the upstream refuses the client's own request for) is left out."""
    if summary_route.base != request_route.base:
        return {}
    return {name: body[name] for name, kind in fields if isinstance(body.get(name), kind)}


# What RFC 3986 allows in a query, percent escapes included: anything else would make the
# summary call's URL invalid, so it is refused before a summary is paid for.
_QUERY = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")


def operator_query(given: str) -> str | None:
    """The query string an operator gives for a manual compaction's summary call (the admin
    API's ``X-Upstream-Query``, with or without its ``?``), standing in for the client query
    a request would carry; None when it is not a valid URL query (pure)."""
    query = given.strip().removeprefix("?")
    return query if _QUERY.fullmatch(query) else None
