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
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.wire import WireFormat
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import caller_format, error_response
from compaction_proxy.http.upstream import Claim
from compaction_proxy.parsing.recent_bodies import Lineage
from compaction_proxy.security.account_endpoints import REFUSAL
from compaction_proxy.security.object_references import KeysSeen, NamedObject, find_references
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


def _unavailable(wire: WireFormat) -> web.Response:
    return error_response(
        503,
        "The proxy cannot tell who owns this account's objects right now (its store is "
        "unavailable): try again shortly.",
        error_type="server_error",
        code="store_unavailable",
        wire=wire,
    )


async def refused_unless_owned(
    request: web.Request, ids: Sequence[str], param: str | None = None
) -> web.Response | None:
    """None when the caller owns every one of ``ids``; else the 404 for the first it does
    not own (503 when the store cannot say)."""
    return await _refused_unless_owned(request, [NamedObject(param or "", i) for i in ids])


async def _refused_unless_owned(
    request: web.Request, named: Sequence[NamedObject]
) -> web.Response | None:
    if not named:
        return None
    wire = caller_format(request)
    try:
        tenant = await _tenant(request)
        asked = list(dict.fromkeys(n.object_id for n in named if is_object_id(n.object_id)))
        found = await request.app[SERVICES].store.object_owners(asked)
        owners = dict(zip(asked, found, strict=True))
    except StoreUnavailable:
        return _unavailable(wire)
    for one in named:
        if owners.get(one.object_id) != tenant:
            message = not_found_message(one.object_id)
            return error_response(404, message, param=one.param or None, wire=wire)
    return None


def named_in_body(
    request: web.Request, raw: bytes, body: Any, lineage: Lineage | None = None
) -> list[NamedObject]:
    """The stored objects a JSON body names (``security.object_references``), when the proxy
    holds keys (else nobody's objects are the proxy's to guard: an empty list, at no cost).
    A body extending a remembered one (``lineage``) is scanned from where they differ.
    Raises BadRequest when a field read for such a decision stands twice in one object."""
    if not request.app[SERVICES].client_keys.required:
        return []
    earlier = lineage.base_scanned.keys if lineage and lineage.base_scanned else None
    if isinstance(earlier, KeysSeen) and lineage is not None:
        found = find_references(raw, body, lineage.shared_bytes, earlier)
    else:
        found = find_references(raw, body)
    if lineage is not None and lineage.scanned is not None:
        lineage.scanned.keys = found.seen
    if found.duplicated is not None:
        raise BadRequest(
            f"The field '{found.duplicated}' is given twice in one JSON object: give it once.",
            param=found.duplicated,
            code="duplicate_key",
        )
    return found.named


async def bound_to_the_account(
    request: web.Request,
    route: Route,
    named: Sequence[NamedObject],
    path_ids: Sequence[str] = (),
) -> web.Response | None:
    """Why a request that names stored objects is not forwarded on ``route``, if it is not.
    Under a key the proxy holds, naming an object binds the request to the account: refused
    unless the route shares the account, or, in owned mode, served only when the caller owns
    every object named, in its path (``path_ids``) and in its body; else the 404 for the
    first it does not own."""
    if not holds_key(request, route) or route.account_endpoints == "shared":
        return None
    if route.account_endpoints == "owned":
        in_path = [NamedObject("", object_id) for object_id in path_ids]
        return await _refused_unless_owned(request, [*in_path, *named])
    if not named:
        return None
    first = named[0]
    shown = not_found_message(first.object_id).removeprefix("No such object: ").rstrip(".")
    return error_response(
        403,
        f"This request names a stored object ({shown} in '{first.param}'). {REFUSAL}",
        error_type="permission_error",
        param=first.param,
        code="account_endpoint_refused",
        wire=caller_format(request),
    )


def claimer(request: web.Request, route: Route) -> Claim | None:
    """What records an object the request creates as its caller's; None outside owned mode."""
    if not owned_mode(request, route):
        return None

    async def claim(object_ids: Sequence[str]) -> None:
        await _claim(request, object_ids)

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
