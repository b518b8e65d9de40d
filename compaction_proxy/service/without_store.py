"""A request served while the store is out of reach: relieved from its own history.

Without the store there are no checkpoints to apply and none to commit, and nothing is
logged. Sent as it came, a history that has outgrown its window would meet a certain
overflow, for the clients that lean on the proxy most (those that never trim). The request
itself carries all model-free relief needs: its observations before the live turn are cut
to their head and tail, for this request alone and as few as it takes, until it fits under
``must_compact``; when that is not enough, its oldest agent turns are left out for a marker
(``compaction.model_free``, on an empty state). A request that fits, a route with the bridge
off or no known window, or cuts that cannot make it fit (a person's words in the way): it
goes as it came (``bypass``).
"""

from __future__ import annotations

from collections.abc import Mapping

from compaction_proxy.compaction.model_free import model_free_relief
from compaction_proxy.compaction.model_policy import ModelPolicy
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.offload import off_loop_if
from compaction_proxy.security.tenant import api_key_of, tenant_of
from compaction_proxy.service.forwarded import Forwarded, RequestStatus, status_of
from compaction_proxy.service.prepare import compaction_job, view_of
from compaction_proxy.service.services import Services
from compaction_proxy.store.base import ConversationState, StoreUnavailable


async def known_tenant(services: Services, client_headers: Mapping[str, str]) -> str | None:
    """The caller's tenant, or None while the tenant secret (kept in the store) is unread."""
    try:
        secret = await services.tenant_secret.get()
    except StoreUnavailable:
        return None
    return tenant_of(secret, api_key_of(client_headers))


async def relieved_without_store(
    services: Services,
    client_request: ClientRequest,
    model_policy: ModelPolicy,
    session_id: str | None,
    client_headers: Mapping[str, str],
    client_query: str,
) -> Forwarded:
    """What to forward for ``client_request`` while the store is out of reach."""
    as_it_came = Forwarded.bypass(client_request.raw)
    pruner = model_policy.bridge
    if pruner is None or not model_policy.policy.auto:
        return as_it_came
    tenant = await known_tenant(services, client_headers)
    if tenant is None:
        return as_it_came  # a secret kept in the store and never read: no tenant to hash
    window = services.model_window(
        model_policy, client_request.model, tenant, client_request.declared_window
    )
    if window is None:
        return as_it_came
    engine = services.engine
    view = await view_of(engine.meter, tenant, client_request, session_id)
    job = compaction_job(
        services,
        view,
        model_policy,
        window,
        client_headers,
        client_query,
        client_request.wire,
        client_request,
    )
    nothing = ConversationState()  # no records, no anchor: the request alone
    surface = view.surface(())
    measurement = await engine.measure(job, nothing, surface)
    limits = model_policy.budgets(window)
    if measurement.tokens < limits.must_compact:
        return as_it_came
    relief = await model_free_relief(
        engine, job, pruner, nothing, surface, view.live_start, measurement, limits
    )
    if relief is None:
        return as_it_came
    cut = relief.surface
    payload = await off_loop_if(view.big, lambda: client_request.wire.payload(client_request, cut))
    status = RequestStatus.TRIMMED if relief.dropped_turns else status_of(cut)
    return Forwarded(payload=payload, status=status, tokens_before=measurement.tokens)
