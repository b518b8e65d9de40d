"""Routing and policy resolution. Pure: settings in, resolved values out.

A model's policy is the defaults, overlaid by its route's ``policy``, overlaid by the route's
``models[<exact model name>]`` entry. Absolute budgets follow from the context window:
``threshold = floor(window * threshold_ratio)``, ``retain = floor(window * retain_ratio)`` or
``retain_tokens``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from pydantic import ValidationError

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import (
    ConfigError,
    Policy,
    PolicyOverrides,
    Route,
    Settings,
)


def configured_route_for(settings: Settings, model: str) -> Route | None:
    """The first configured route whose pattern matches ``model``, if any."""
    for route in settings.routes:
        if fnmatchcase(model, route.model):
            return route
    return None


def route_for(settings: Settings, model: str) -> Route:
    """The first configured route whose pattern matches ``model``, else the default route."""
    return configured_route_for(settings, model) or settings.default_route


def family_route_for(settings: Settings, model: str | None, family: ApiFamily) -> Route:
    """Where a request of ``family`` goes: the first configured route matching its ``model``,
    else the family's default route: ``upstream_base_url``, or ``anthropic_base_url`` for
    Anthropic's (the default route is an OpenAI-format upstream, its key not for Anthropic)."""
    found = configured_route_for(settings, model) if model is not None else None
    if found is not None:
        return found
    if family is ApiFamily.ANTHROPIC:
        return settings.anthropic_route
    return settings.default_route


def _overlay(policy: Policy, overrides: PolicyOverrides) -> dict[str, Any]:
    merged = policy.model_dump()
    given = overrides.model_dump(exclude_none=True, exclude={"context_window"})
    if "retain_tokens" in given:
        merged["retain_ratio"] = None
    if "retain_ratio" in given:
        merged["retain_tokens"] = None
    merged.update(given)
    return merged


def resolve_policy(settings: Settings, route: Route, model: str) -> Policy:
    """Defaults, then the route's overrides, then the exact-model override."""
    layers: list[PolicyOverrides] = [route.policy]
    exact = route.models.get(model)
    if exact is not None:
        layers.append(exact)
    policy = settings.policy
    for layer in layers:
        try:
            policy = Policy(**_overlay(policy, layer))
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'policy'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(
                f"policy for model {model!r} (route {route.model!r}): {details}"
            ) from exc
    return policy


def configured_window(route: Route, model: str) -> int | None:
    exact = route.models.get(model)
    if exact is not None and exact.context_window is not None:
        return exact.context_window
    return route.context_window


def validate_all_policies(settings: Settings) -> None:
    """Resolve every route's policy and every exact-model override once, at start-up."""
    for route in settings.routes:
        resolve_policy(settings, route, route.model)
        for model in route.models:
            resolve_policy(settings, route, model)
