"""``account_endpoints: owned`` at the edge: who asks, whether they own what they address, and
recording what their answers create (the rules are ``security.owned_objects``).

It applies when the proxy holds the key a request goes out with (``holds_key``) and the route
says ``owned``. The store then keeps, per object id, the tenant whose answer created it. A
caller that addresses an object it does not own gets the 404 the API gives for an id that does
not exist, so it learns nothing of other tenants' objects, not even that they exist. When the
store cannot be read, ownership cannot be checked: 503, never the object.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.config.settings import Route
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import error_response
from compaction_proxy.http.upstream import Claim
from compaction_proxy.security.outbound import speaks_anthropic
from compaction_proxy.security.owned_objects import (
    LISTS,
    created_objects,
    is_object_id,
    listed_objects,
    not_found_message,
    own_list,
)
from compaction_proxy.security.tenant import api_key_of, tenant_of
from compaction_proxy.store.base import StoreUnavailable

log = logging.getLogger(__name__)


def holds_key(request: web.Request, route: Route) -> bool:
    """Whether the request reaches the upstream on a key the proxy holds: its route's, or,
    once the proxy holds any (clients then authenticate with keys of its own), whichever key
    the route has, none included: no client's own account is behind it."""
    return route.api_key_env is not None or request.app[SERVICES].client_keys.required


def owned_mode(request: web.Request, route: Route) -> bool:
    return route.account_endpoints == "owned" and holds_key(request, route)


async def _tenant(request: web.Request) -> str:
    secret = await request.app[SERVICES].tenant_secret.get()
    return tenant_of(secret, api_key_of(request.headers))


def _unavailable(anthropic: bool) -> web.Response:
    return error_response(
        503,
        "The proxy cannot tell who owns this account's objects right now (its store is "
        "unavailable): try again shortly.",
        error_type="server_error",
        code="store_unavailable",
        anthropic=anthropic,
    )


async def refused_unless_owned(
    request: web.Request, ids: Sequence[str], param: str | None = None
) -> web.Response | None:
    """None when the caller owns every one of ``ids``; else the 404 for the first it does
    not own (503 when the store cannot say)."""
    if not ids:
        return None
    anthropic = speaks_anthropic(request.path, request.headers)
    try:
        tenant = await _tenant(request)
        asked = [object_id for object_id in ids if is_object_id(object_id)]
        found = await request.app[SERVICES].store.object_owners(asked)
        owners = dict(zip(asked, found, strict=True))
    except StoreUnavailable:
        return _unavailable(anthropic)
    for object_id in ids:
        if owners.get(object_id) != tenant:
            message = not_found_message(object_id)
            return error_response(404, message, param=param, anthropic=anthropic)
    return None


def claimer(request: web.Request, route: Route) -> Claim | None:
    """What records an object the request creates as its caller's; None outside owned mode."""
    if not owned_mode(request, route):
        return None

    async def claim(object_id: str) -> None:
        await _claim(request, [object_id])

    return claim


async def _claim(request: web.Request, ids: Sequence[str]) -> None:
    services = request.app[SERVICES]
    ids = [object_id for object_id in ids if is_object_id(object_id)]
    if not ids:
        return
    try:
        tenant = await _tenant(request)
        await services.store.claim_objects(tenant, ids, services.settings.store_ttl_seconds)
    except StoreUnavailable as exc:
        # Fails closed: the creator will be refused its object, nobody else served it.
        log.warning("could not record who created %d object(s) (%s)", len(ids), exc.operation)


async def owned_answer(request: web.Request, template: str, body: bytes) -> bytes:
    """A whole successful JSON answer as the caller may have it: what it creates recorded as
    theirs, a list narrowed to their own objects."""
    try:
        answer: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    await _claim(request, created_objects(template, request.method, answer))
    if request.method != "GET" or template not in LISTS or not isinstance(answer, dict):
        return body
    asked = [object_id for object_id in listed_objects(answer) if is_object_id(object_id)]
    try:
        tenant = await _tenant(request)
        owners = await request.app[SERVICES].store.object_owners(asked)
    except StoreUnavailable:
        return orjson.dumps(own_list(answer, lambda _: False))  # fails closed: an empty page
    mine = {object_id for object_id, owner in zip(asked, owners, strict=True) if owner == tenant}
    return orjson.dumps(own_list(answer, lambda object_id: object_id in mine))
