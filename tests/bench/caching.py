"""A provider's prompt cache and bill, modelled on what the upstream received (benchmarks).

Providers cache prompt prefixes: a prompt that starts with messages an earlier prompt of the
same conversation started with is read from cache (billed at a tenth on Anthropic, for
example), and the rest is written to it (billed at 1.25x). Compaction changes the forwarded
prefix, so it trades fewer tokens against cache misses; these helpers measure both sides.
Prefixes are compared message by message, as cache breakpoints fall on message boundaries.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request
from compaction_proxy.testing.fake_upstream import FakeUpstream

CACHE_READ = 0.1
CACHE_WRITE = 1.25
OUTPUT = 4.0  # an output token costs four input tokens

Message = dict[str, Any]


@dataclass
class Bill:
    """Prompt tokens split by the cache, and summary output, for one conversation."""

    cached: int = 0
    uncached: int = 0
    output: int = 0

    @property
    def prompt(self) -> int:
        return self.cached + self.uncached

    @property
    def hit_ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    @property
    def units(self) -> float:
        """Billed input units: cached reads, cache writes, output at its price."""
        return self.cached * CACHE_READ + self.uncached * CACHE_WRITE + self.output * OUTPUT


class PrefixCache:
    """Per conversation, every message prefix sent so far."""

    def __init__(self, fake: FakeUpstream) -> None:
        self._fake = fake
        self._seen: dict[str, set[bytes]] = defaultdict(set)
        self._tokens: dict[bytes, int] = {}

    def _message_tokens(self, encoded: bytes, message: Message) -> int:
        if encoded not in self._tokens:
            self._tokens[encoded] = self._fake.prompt_tokens({"messages": [message]})
        return self._tokens[encoded]

    def send(self, conversation: str, messages: list[Message], bill: Bill) -> None:
        """Add one prompt to ``bill``: the leading messages seen before are cache reads."""
        prefixes = self._seen[conversation]
        chain = hashlib.sha256()
        cached_run = True
        for message in messages:
            encoded = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            chain.update(encoded)
            digest = chain.copy().digest()
            tokens = self._message_tokens(encoded, message)
            cached_run = cached_run and digest in prefixes
            if cached_run:
                bill.cached += tokens
            else:
                bill.uncached += tokens
            prefixes.add(digest)


def bills_by_conversation(
    fake: FakeUpstream, requests: Iterable[Any], key: str = "Authorization"
) -> dict[str, Bill]:
    """What the upstream received, billed per conversation (one per ``key`` header), summary
    calls included (their output at the output price)."""
    cache = PrefixCache(fake)
    bills: dict[str, Bill] = defaultdict(Bill)
    for received in requests:
        if received.body is None or not received.path.endswith("/chat/completions"):
            continue
        conversation = received.headers.get(key, "")
        bill = bills[conversation]
        cache.send(conversation, received.body["messages"], bill)
        if is_summary_request(received.body):
            bill.output += fake.count_text(fake_summary(received.body))
    return dict(bills)
