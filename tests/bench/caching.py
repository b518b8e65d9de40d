"""A provider's prompt cache and bill, modelled on what the upstream received (benchmarks).

Providers cache prompt prefixes: a prompt that starts with messages an earlier prompt of the
same conversation started with is read from cache (billed at a tenth on Anthropic, for
example), and the rest is written to it (billed at 1.25x). Compaction changes the forwarded
prefix, so it trades fewer tokens against cache misses; these helpers measure both sides.
Prefixes are compared message by message, as cache breakpoints fall on message boundaries.
Anthropic caches only where the client places breakpoints: ``BreakpointCache`` models that.
OpenAI, from its GPT-5.6 family on, writes an entry only at a breakpoint, by default the one it
puts at the end of each prompt's newest message that is not the model's, and a prompt reads
only a prefix an earlier one wrote whole: ``PrefixCache(at_breakpoints=True)``, on the
``openai-5.6`` preset's bills.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.compaction.cache_prices import PRESETS, CachePrices
from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request
from compaction_proxy.testing.fake_responses import input_items
from compaction_proxy.testing.fake_upstream import FakeUpstream

ANTHROPIC = PRESETS["anthropic"]

Message = dict[str, Any]


@dataclass
class Spend:
    """Where a bill's units go. ``new``: prompt tokens the conversation never sent before,
    written to the cache (or billed plain): what any client pays for its growing history.
    ``rewrites``: tokens sent before, written again because something ahead of them changed.
    ``reads``: cache reads. ``summaries``: the summary calls, prompt and output."""

    new: float = 0.0
    rewrites: float = 0.0
    reads: float = 0.0
    summaries: float = 0.0

    def add(self, other: Spend) -> None:
        self.new += other.new
        self.rewrites += other.rewrites
        self.reads += other.reads
        self.summaries += other.summaries


@dataclass
class Bill:
    """Prompt tokens split by the cache, and summary output, for one conversation, billed at
    ``prices`` (multiples of an uncached input token; Anthropic's unless given)."""

    prices: CachePrices = ANTHROPIC
    cached: int = 0
    uncached: int = 0  # written to the cache
    output: int = 0
    plain: int = 0  # after the last breakpoint (Anthropic): neither read nor written
    spend: Spend = field(default_factory=Spend)

    @property
    def prompt(self) -> int:
        return self.cached + self.uncached + self.plain

    def add(self, other: Bill) -> None:
        self.cached += other.cached
        self.uncached += other.uncached
        self.output += other.output
        self.plain += other.plain
        self.spend.add(other.spend)

    def charge(self, cached: int, written: int, plain: int, sent_before: bool) -> None:
        """Add one message's (or block's) tokens: ``cached`` read, ``written`` to the cache,
        ``plain`` neither; ``sent_before``: whether the conversation sent it earlier."""
        self.cached += cached
        self.uncached += written
        self.plain += plain
        self.spend.reads += cached * self.prices.read
        paid = written * self.prices.write + plain
        if sent_before:
            self.spend.rewrites += paid
        else:
            self.spend.new += paid

    def as_summary_call(self, output: int) -> Bill:
        """This bill, of a summary call that wrote ``output`` tokens, counted as one."""
        self.output += output
        self.spend = Spend(summaries=self.units)
        return self

    @property
    def hit_ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    @property
    def uncached_units(self) -> float:
        """What the same tokens cost on a provider that caches nothing."""
        return self.prompt + self.output * self.prices.output

    @property
    def units(self) -> float:
        """Billed input units: cached reads, cache writes, output at its price."""
        prices = self.prices
        return (
            self.cached * prices.read
            + self.uncached * prices.write
            + self.plain
            + self.output * prices.output
        )


def at_implicit_breakpoints(prices: CachePrices) -> bool:
    """Whether a provider billed at ``prices`` caches as OpenAI does from GPT-5.6 on."""
    return prices == PRESETS["openai-5.6"]


def _implicit_breakpoint(messages: list[Message]) -> int:
    """Where OpenAI's implicit breakpoint falls: the prompt's newest message or item that is
    not the model's (a message of another role, a tool's output); -1 when there is none."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        role, kind = message.get("role"), message.get("type")
        if role not in (None, "assistant") or str(kind).endswith("_output"):
            return index
    return -1


class PrefixCache:
    """Per conversation, every message prefix sent so far (``at_breakpoints``: only those
    ending at an implicit breakpoint, see the module's docstring)."""

    def __init__(self, fake: FakeUpstream, at_breakpoints: bool = False) -> None:
        self._fake = fake
        self._at_breakpoints = at_breakpoints
        self._seen: dict[str, set[bytes]] = defaultdict(set)
        self._sent: dict[str, set[bytes]] = defaultdict(set)  # messages, wherever they stood
        self._tokens: dict[bytes, int] = {}

    def _message_tokens(self, encoded: bytes, message: Message) -> int:
        if encoded not in self._tokens:
            if "role" in message or "type" not in message:
                tokens = self._fake.prompt_tokens({"messages": [message]})
            else:  # a Responses item that is no message: a call, its output, reasoning
                tokens = self._fake.responses.input_tokens({"input": [message]}) - 3
            self._tokens[encoded] = tokens
        return self._tokens[encoded]

    def send(self, conversation: str, messages: list[Message], bill: Bill) -> None:
        """Add one prompt to ``bill``: the leading messages seen before are cache reads."""
        if self._at_breakpoints:
            self._send_at_breakpoint(conversation, messages, bill)
            return
        prefixes, sent = self._seen[conversation], self._sent[conversation]
        chain = hashlib.sha256()
        cached_run = True
        for message in messages:
            encoded = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            chain.update(encoded)
            digest = chain.copy().digest()
            tokens = self._message_tokens(encoded, message)
            cached_run = cached_run and digest in prefixes
            if cached_run:
                bill.charge(tokens, 0, 0, True)
            else:
                bill.charge(0, tokens, 0, encoded in sent)
            prefixes.add(digest)
            sent.add(encoded)

    def _send_at_breakpoint(self, conversation: str, messages: list[Message], bill: Bill) -> None:
        """``send`` on OpenAI's terms from GPT-5.6: the longest prefix an earlier prompt wrote
        at its breakpoint is read, the rest up to this prompt's breakpoint written, and what
        follows it (the model's own messages at the end) billed plain."""
        written, sent = self._seen[conversation], self._sent[conversation]
        chain = hashlib.sha256()
        digests: list[bytes] = []
        units: list[tuple[bytes, int]] = []
        for message in messages:
            encoded = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            chain.update(encoded)
            digests.append(chain.copy().digest())
            units.append((encoded, self._message_tokens(encoded, message)))
        read = next((i + 1 for i in range(len(digests) - 1, -1, -1) if digests[i] in written), 0)
        mark = _implicit_breakpoint(messages)
        for index, (encoded, tokens) in enumerate(units):
            if index < read:
                bill.charge(tokens, 0, 0, True)
            elif index <= mark:
                bill.charge(0, tokens, 0, encoded in sent)
            else:
                bill.charge(0, 0, tokens, encoded in sent)
            sent.add(encoded)
        if mark >= 0:
            written.add(digests[mark])


def bills_by_conversation(
    fake: FakeUpstream,
    requests: Iterable[Any],
    key: str = "Authorization",
    prices: CachePrices = ANTHROPIC,
) -> dict[str, Bill]:
    """What the upstream received, billed per conversation (one per ``key`` header) at
    ``prices``, summary calls included (their output at the output price)."""
    cache = PrefixCache(fake, at_implicit_breakpoints(prices))
    bills: dict[str, Bill] = defaultdict(lambda: Bill(prices))
    for received in requests:
        if received.body is None or not received.path.endswith("/chat/completions"):
            continue
        conversation = received.headers.get(key, "")
        bill = Bill(prices)
        cache.send(conversation, received.body["messages"], bill)
        if is_summary_request(received.body):
            bill.as_summary_call(fake.count_text(fake_summary(received.body)))
        bills[conversation].add(bill)
    return dict(bills)


# -- Anthropic: explicit breakpoints -------------------------------------------------------

LOOKBACK_BLOCKS = 20  # how far before a breakpoint Anthropic looks for a cached prefix


def _blocks(body: dict[str, Any]) -> list[Any]:
    """A Messages request as the cache sees it: tools, system blocks, then every turn's
    blocks, in order."""

    def as_blocks(content: Any) -> list[Any]:  # a string is the one text block it stands for
        return content if isinstance(content, list) else [{"type": "text", "text": content}]

    blocks: list[Any] = list(body.get("tools") or [])
    blocks += as_blocks(body["system"]) if body.get("system") else []
    for turn in body.get("messages") or []:
        blocks += as_blocks(turn.get("content"))
    return blocks


class BreakpointCache:
    """Anthropic's prompt cache, per conversation: a prefix is written at each breakpoint
    (a block with ``cache_control``); a request reads the longest prefix written before that
    ends at most ``LOOKBACK_BLOCKS`` blocks before one of its breakpoints; what lies after
    its last breakpoint is billed plain."""

    def __init__(self, fake: FakeUpstream) -> None:
        self._fake = fake
        self._seen: dict[str, set[bytes]] = defaultdict(set)
        self._sent: dict[str, set[bytes]] = defaultdict(set)  # blocks, wherever they stood

    def send(self, conversation: str, body: dict[str, Any], bill: Bill) -> None:
        blocks = _blocks(body)
        chain = hashlib.sha256()
        ends: list[bytes] = []
        tokens: list[int] = []
        contents: list[bytes] = []
        for block in blocks:
            content = block
            if isinstance(block, dict):  # a breakpoint marks a block, it is not its content
                content = {k: v for k, v in block.items() if k != "cache_control"}
            contents.append(orjson.dumps(content, option=orjson.OPT_SORT_KEYS))
            chain.update(contents[-1])
            ends.append(chain.copy().digest())
            tokens.append(self._fake.messages.block_tokens(block))
        marks = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("cache_control")]
        written = self._seen[conversation]
        read = 0  # blocks read from cache
        for mark in marks:
            for end in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                if ends[end] in written:
                    read = max(read, end + 1)
                    break
        last = marks[-1] + 1 if marks else 0
        sent = self._sent[conversation]
        for index, (count, content) in enumerate(zip(tokens, contents, strict=True)):
            if index < read:
                bill.charge(count, 0, 0, True)
            elif index < last:
                bill.charge(0, count, 0, content in sent)
            else:
                bill.charge(0, 0, count, content in sent)
        sent.update(contents)
        written.update(ends[mark] for mark in marks)


def breakpoint_bills(
    fake: FakeUpstream, key: str = "x-api-key", prices: CachePrices = ANTHROPIC
) -> dict[str, Bill]:
    """``bills_by_conversation`` for what reached the fake's Messages API."""
    cache = BreakpointCache(fake)
    bills: dict[str, Bill] = defaultdict(lambda: Bill(prices))
    for received in fake.messages.received:
        conversation = received.headers.get(key, "")
        bill = Bill(prices)
        cache.send(conversation, received.body, bill)
        if is_summary_request(received.body):
            bill.as_summary_call(fake.count_text(fake_summary(received.body)))
        bills[conversation].add(bill)
    return dict(bills)


def responses_units(body: dict[str, Any]) -> list[Message]:
    """A Responses request as its prefix cache sees it: its instructions, then its items."""
    instructions = body.get("instructions")
    head = [{"role": "system", "content": instructions}] if instructions else []
    return [*head, *input_items(body)]


def responses_bills(
    fake: FakeUpstream, key: str = "Authorization", prices: CachePrices = ANTHROPIC
) -> dict[str, Bill]:
    """``bills_by_conversation`` for what reached the fake's Responses API (input items as the
    cache's units, the instructions first), summary calls made in Responses form among them,
    and those made in chat form beside them."""
    cache = PrefixCache(fake, at_implicit_breakpoints(prices))
    bills: dict[str, Bill] = defaultdict(lambda: Bill(prices))
    for body, headers in zip(fake.responses.received, fake.responses.headers_received, strict=True):
        conversation = headers.get(key, "")
        bill = Bill(prices)
        cache.send(conversation, responses_units(body), bill)
        if is_summary_request(body):
            bill.as_summary_call(fake.count_text(fake_summary(body)))
        bills[conversation].add(bill)
    for conversation, bill in bills_by_conversation(fake, fake.received, key, prices).items():
        bills[conversation].add(bill)
    return dict(bills)
