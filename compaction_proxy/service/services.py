"""Everything the life of a request needs, in one object built once by the app factory.

``compaction_proxy.ops.app`` opens these at start-up (the store first, the HTTP client and the
pending records last) and closes them in reverse order at shutdown, so the last records are
written and every background round has freed its lease before the store closes. Service code
(preparation, recovery, the record, the admin API) is handed this object; nothing below the
edge reads the web application's state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import field

from compaction_proxy.compaction.background import BackgroundCompactions
from compaction_proxy.compaction.engine import Engine
from compaction_proxy.compaction.model_policy import ModelPolicy, PolicyBook
from compaction_proxy.config.settings import Settings
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.windows import LearnedWindows, resolve_window, window_key
from compaction_proxy.parsing.recent_bodies import RecentBodies
from compaction_proxy.security.admin_guesses import AdminGuesses
from compaction_proxy.security.client_keys import ClientKeys
from compaction_proxy.security.loopback import LoopbackVouch
from compaction_proxy.security.tenant import TenantSecret
from compaction_proxy.security.upload_slots import UploadSlots
from compaction_proxy.security.upstream_shares import UpstreamShares
from compaction_proxy.service.pending_writes import PendingLogWrites
from compaction_proxy.store.base import Store
from compaction_proxy.upstream_seam import Upstream


@frozen
class Services:
    settings: Settings
    store: Store
    engine: Engine
    policies: PolicyBook
    learned_windows: LearnedWindows
    # Every call to a compacted route's upstream: the requests, their retries, the summary
    # calls, the model list, and Responses requests whose history the provider holds,
    # relayed as sent (``upstream_seam``; aiohttp's client in the product).
    upstream: Upstream
    # Every other relayed path, WebSocket sessions included, on a pool of its own: it can
    # never take the upstream's.
    relay_upstream: Upstream
    upload_slots: UploadSlots
    upstream_shares: UpstreamShares
    client_keys: ClientKeys
    tenant_secret: TenantSecret
    background: BackgroundCompactions
    known_messages: KnownMessages
    recent_bodies: RecentBodies
    pending_log_writes: PendingLogWrites
    # Names the client a WebSocket frame's request to this process stands for.
    loopback: LoopbackVouch
    # Requests being forwarded per conversation on this process (manual compaction waits
    # for 0).
    in_flight: Counter[str] = field(default_factory=Counter)
    admin_guesses: AdminGuesses = field(default_factory=AdminGuesses)

    def model_window(
        self, model_policy: ModelPolicy, model: str, tenant: str, declared: int | None = None
    ) -> int | None:
        """The window in force for ``tenant``'s requests to ``model``: configured, else the
        one the request declares (``ClientRequest.declared_window``), else litellm's map;
        never above a limit the upstream stated to that tenant (``LearnedWindows``)."""
        learned = self.learned_windows.get(
            model_policy.route.model, tenant, window_key(model, declared)
        )
        mapped = declared if declared is not None else model_policy.mapped_window
        return resolve_window(model_policy.configured_window, mapped, learned)
