"""One request as the compaction machinery sees it: head, body, chain, digests, tools.

Derives the surface for a set of replacement records and measures it; holds no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from compaction_proxy.computed_once import computed_once
from compaction_proxy.conversation.fingerprint import context_fingerprint
from compaction_proxy.conversation.messages import (
    Message,
    chain_hashes,
    chain_root,
    conversation_id,
    live_turn_start,
    message_digest,
    split_head,
)
from compaction_proxy.conversation.replacements import ReplacementRecord
from compaction_proxy.conversation.surface import Surface, derive_surface
from compaction_proxy.frozen import frozen
from compaction_proxy.lru import LRU
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.metering.meter import Measurement, TokenMeter
from compaction_proxy.offload import is_big
from compaction_proxy.parsing import jsonio
from compaction_proxy.parsing.recent_bodies import Lineage

# A context's digest (see ``RequestView.context_fingerprint``) -> its fingerprint, per process
_FINGERPRINTS: LRU[str, str] = LRU(1024)
# id(tools) -> the tools and their digest. The tools are held, so no other object can have
# their id while they are here (parsed bodies are never modified; most of these objects are
# held by remembered bodies anyway).
_TOOLS_DIGESTS: LRU[int, tuple[Any, str]] = LRU(256)


@frozen
class RequestView:
    tenant: str
    conversation: str
    model: str
    head: list[Message]
    body: list[Message]
    root: str
    chain: list[str]
    head_digests: list[str]
    body_digests: list[str]
    tools: Any = None
    size: int = 0  # the request body's bytes on the wire (0 when unknown)
    _surfaces: dict[int, tuple[Sequence[ReplacementRecord], Surface]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(
        cls,
        tenant: str,
        model: str,
        messages: list[Message],
        session_id: str | None,
        tools: Any = None,
        conversation: str | None = None,
        size: int = 0,
        digests: Sequence[str] | None = None,
        lineage: Lineage | None = None,
    ) -> RequestView:
        """``conversation`` overrides the derived id (when it is already known, e.g. from the
        admin API for a conversation named by a session header); ``digests`` are the
        messages' ``message_digest``s when the parse already computed them; ``lineage``, the
        chain of a body this one extends (the chain is left there for the next one)."""
        head, body = split_head(messages)
        if digests is None:
            digests = [message_digest(m) for m in messages]
        cut = len(head)
        head_digests = list(digests[:cut])
        # A list's slice is a copy already (each copy touches every digest of the history).
        body_digests = digests[cut:] if isinstance(digests, list) else list(digests[cut:])
        root = chain_root(tenant)
        if lineage is None:
            chain = chain_hashes(root, body, body_digests)
        else:
            chain = chain_hashes(root, body, body_digests, lineage.known(root, len(head)))
            lineage.own[root] = chain
        return cls(
            tenant=tenant,
            conversation=conversation or conversation_id(tenant, root, chain, session_id),
            model=model,
            head=head,
            body=body,
            root=root,
            chain=chain,
            head_digests=head_digests,
            body_digests=body_digests,
            tools=tools,
            size=size,
        )

    @property
    def big(self) -> bool:
        """Work over this request runs off the event loop (see ``offload``)."""
        return is_big(self.size, len(self.head) + len(self.body))

    @computed_once
    def live_start(self) -> int:
        """Body position where the live turn starts (see ``live_turn_start``)."""
        return live_turn_start(self.body)

    @computed_once
    def answers(self) -> int:
        """The answers the conversation has had: its assistant messages (the turns a step's
        price counts ahead, ``compaction.cache_prices.turns_ahead``)."""
        return sum(1 for message in self.body if message.get("role") == "assistant")

    @computed_once
    def tools_digest(self) -> str:
        """Names the request's tools. An agent sends the same tens of KiB of them every time,
        and a body parsed from a remembered one shares them with it, as the same object
        (``parsing.recent_bodies``): so they are hashed once per object, not per request."""
        tools = self.tools
        known = _TOOLS_DIGESTS.get(id(tools))
        if known is not None:
            return known[1]
        digest = hashlib.blake2b(jsonio.dumps(tools or None), digest_size=16).hexdigest()
        _TOOLS_DIGESTS.put(id(tools), (tools, digest))
        return digest

    @computed_once
    def context_digest(self) -> str:
        """Names the request's head and tools together (logged once per distinct value)."""
        h = hashlib.blake2b(bytes.fromhex(self.tools_digest), digest_size=16)
        for digest in self.head_digests:
            h.update(bytes.fromhex(digest))
        return h.hexdigest()

    @computed_once
    def context_fingerprint(self) -> str:
        """The request's instructions up to volatile details (see
        ``conversation.fingerprint``): asked on every request of a compacted conversation,
        and normalizing an agent's instructions (tens of KiB of system prompt and tools) takes
        milliseconds, so it is done once per process for each distinct head and tools
        (``context_digest`` names them exactly)."""
        # ``context_digest`` names the head and tools up to what canonical messages drop; of
        # that, the fingerprint tells only a null content from an empty one, so the key does.
        key = self.context_digest + "".join(
            "0" if message.get("content") is None else "1" for message in self.head
        )
        known = _FINGERPRINTS.get(key)
        if known is None:
            known = context_fingerprint(self.head, self.tools)
            _FINGERPRINTS.put(key, known)
        return known

    def applicable(self, records: Sequence[ReplacementRecord]) -> list[ReplacementRecord]:
        """The records made under this request's instructions (or before those were kept)."""
        if all(not record.context for record in records):
            return list(records)  # nothing to compare: spare the normalization
        own = self.context_fingerprint
        return [record for record in records if record.context in ("", own)]

    def surface(self, records: Sequence[ReplacementRecord]) -> Surface:
        """The surface for ``records`` that apply to this request; derived once per records
        sequence (the request is immutable, and its steps ask for the same state's surface
        several times)."""
        key = id(records)
        cached = self._surfaces.get(key)
        if cached is not None and cached[0] is records:
            return cached[1]
        applicable = self.applicable(records)
        surface = derive_surface(self.head, self.body, self.chain, self.root, applicable)
        self._surfaces[key] = (records, surface)
        return surface

    def measure(
        self, meter: TokenMeter, surface: Surface, anchor: Anchor | None = None
    ) -> Measurement:
        return meter.measure(self, surface, anchor)
