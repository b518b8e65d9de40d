"""Observation masking (pure): old observations cleared to a one-line placeholder.

Between pruning and summarizing, with no model call: an agent whose old tool outputs are
replaced by a placeholder solves as many tasks as one given LLM summaries of them
(docs/compaction.md, "Observation masking", for the study and what it costs here); Anthropic's
``clear_tool_uses`` and Claude Code's microcompact make the same move. The call stays; its
output becomes one line naming the tool, a short form of its arguments and the size cleared,
and saying the tool can be run again.

**Which observations.** Tool and legacy function results; in a body holding none of those,
the user messages an observation-style agent returns its outputs in (when the pruner counts
user messages as observations; ``conversation.agent_outputs``), never the task. Only those
before ``before`` (the retained tail and the live turn are never offered; neither are the head
and checkpoints, which are not body nodes), oldest first, never one of the newest ``keep``
observations of the body, never one of a tool in ``exclude_tools``, never one already masked,
never the output of a call repeating a masked one (a re-read: the agent needed it back), and
only where the placeholder is less than half of what it replaces.

**How much.** The step is worth a cache miss only when it frees at least ``clear_at_least``
tokens and leaves the request that much under its threshold (``mask_relieves``): every
observation that qualifies is cleared at once, so the provider's prefix cache breaks once,
from the oldest, and the next step (newer observations aging out of the tail) breaks it only
near the end. Inputs are never mutated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import orjson

from compaction_proxy.conversation.agent_outputs import is_agent_output
from compaction_proxy.conversation.messages import Message, task_position
from compaction_proxy.conversation.surface import SurfaceNode
from compaction_proxy.conversation.text import text_of
from compaction_proxy.frozen import frozen

DEFAULT_CLEAR_SHARE = 10  # clear_at_least defaults to a tenth of the window
ARGUMENTS_CHARS = 120  # the short form of a call's arguments
OPENING_CHARS = 80  # the short form of an observation-style message's opening

TOOL_PLACEHOLDER = (
    "[compaction-proxy cleared this output of {call} to save context: {size:,} characters. "
    "Run the tool again if you need it.]"
)
OBSERVATION_PLACEHOLDER = (
    "[compaction-proxy cleared this earlier observation to save context: {size:,} characters, "
    'beginning "{opening}". Run the command again if you need it.]'
)


@frozen
class Masker:
    """Masking settings, resolved for one model (``config.settings.MaskingPolicy``)."""

    keep: int = 3
    exclude_tools: frozenset[str] = frozenset()
    clear_at_least: int | None = None  # tokens; None: a tenth of the window
    user_messages: bool = True  # the pruner's: user messages count as observations

    def __post_init__(self) -> None:
        if self.keep < 0:
            raise ValueError("keep must be non-negative")
        if self.clear_at_least is not None and self.clear_at_least < 0:
            raise ValueError("clear_at_least must be non-negative")

    def clear_at_least_for(self, window: int) -> int:
        """The fewest tokens a masking step must free in ``window``."""
        if self.clear_at_least is not None:
            return self.clear_at_least
        return window // DEFAULT_CLEAR_SHARE


class MaskCandidate(NamedTuple):
    """The observation at body ``position``: its placeholder, the tool it answered (None for
    an observation-style user message) and the size of the text it clears."""

    position: int
    placeholder: str
    tool: str | None
    chars_before: int


def mask_relieves(tokens: int, saved: int, threshold: int, clear_at_least: int) -> bool:
    """Whether a step saving ``saved`` of a request's ``tokens`` is worth its cache miss: it
    frees at least ``clear_at_least`` and leaves at least that much room under ``threshold``
    (else a summary would follow within a turn or two, and the miss bought nothing)."""
    return saved >= clear_at_least and tokens - saved <= threshold - clear_at_least


def short(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def call_form(name: str, arguments: Any) -> str:
    """``name(key=value, ...)`` from a call's JSON arguments, shortened; the raw string when
    they are not a JSON object."""
    parsed: Any = arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            parsed = arguments
    if isinstance(parsed, dict):
        inner = ", ".join(
            f"{key}={orjson.dumps(value).decode() if not isinstance(value, str) else repr(value)}"
            for key, value in parsed.items()
        )
    else:
        inner = arguments if isinstance(arguments, str) else ""
    return f"{short(name, 64)}({short(inner, ARGUMENTS_CHARS)})"


def call_key(name: str, arguments: Any) -> str:
    """The call ``name(arguments)`` whole, its JSON arguments in one spelling: two calls of a
    tool with the same arguments have the same key however their JSON was written."""
    if isinstance(arguments, str):
        return _string_call_key(name, arguments)
    try:
        return f"{name}\x00{orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()}"
    except TypeError:
        return f"{name}\x00{arguments!r}"


# A masked conversation's calls are keyed again on every request that counts re-reads: each
# call's key is worked out once (chat sends arguments as a JSON string).
@functools.lru_cache(maxsize=8192)
def _string_call_key(name: str, arguments: str) -> str:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return f"{name}\x00{arguments}"
    return f"{name}\x00{orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()}"


class Observation(NamedTuple):
    position: int
    tool: str | None  # the tool's name; None for an observation-style user message
    arguments: Any = None  # the call's arguments as sent

    @property
    def call(self) -> str | None:
        """The call's short form, for a placeholder (parsed only for what is masked)."""
        return None if self.tool is None else call_form(self.tool, self.arguments)

    @property
    def key(self) -> str | None:
        """The call whole: a repeat of it has the same (``call_key``)."""
        return None if self.tool is None else call_key(self.tool, self.arguments)


def _calls(message: Message) -> Iterator[tuple[str, str, Any]]:
    """(id, name, arguments) of an assistant message's tool calls."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(call.get("id"), str):
            name = function.get("name")
            yield call["id"], name if isinstance(name, str) else "tool", function.get("arguments")


def observations(body: Sequence[Message], user_messages: bool) -> list[Observation]:
    """The body's observations in order, each with the call it answers. Call ids repeat in
    real agents' histories: a result answers the latest call of its id before it."""
    found: list[Observation] = []
    calls: dict[str, tuple[str, Any]] = {}
    legacy: tuple[str, Any] | None = None
    for position, message in enumerate(body):
        role = message.get("role")
        if role == "assistant":
            for call_id, name, arguments in _calls(message):
                calls[call_id] = (name, arguments)
            function_call = message.get("function_call")
            if isinstance(function_call, dict):
                legacy = (
                    str(function_call.get("name", "function")),
                    function_call.get("arguments"),
                )
        elif role == "tool":
            answered = message.get("tool_call_id")
            key = answered if isinstance(answered, str) else ""
            tool, arguments = calls.get(key, ("tool", None))
            found.append(Observation(position, tool, arguments))
        elif role == "function":
            named: Any = message.get("name")
            if not isinstance(named, str):
                named = legacy[0] if legacy is not None else "function"
            tool = str(named)
            arguments = legacy[1] if legacy is not None and legacy[0] == tool else None
            found.append(Observation(position, tool, arguments))
    if found or not user_messages:
        return found
    task = task_position(body)
    return [
        Observation(p, None)
        for p in range(1, len(body))
        if p != task and is_agent_output(body[p], body[p - 1])
    ]


def rereads(
    found: Sequence[Observation], masked: Callable[[int], bool], since: int = 0
) -> set[int]:
    """Positions (from ``since``) of the observations answering a call that repeats a masked
    one (the same tool, the same arguments): the agent ran it again because its output was
    cleared. Such an output is not masked again (``mask_candidates``): clearing it would only
    buy another run. Only the masked calls and those from ``since`` are read whole."""
    cleared = {o.key for o in found if o.tool is not None and masked(o.position)}
    if not cleared:
        return set()
    return {
        o.position
        for o in found
        if o.position >= since and o.tool is not None and not masked(o.position)
        if o.key in cleared
    }


def live_rereads(
    body: Sequence[Message], live_start: int, masked: Callable[[int], bool], user_messages: bool
) -> int:
    """How many of the live turn's observations answer a call repeating a masked one (only
    tool and function results answer a call: a live turn without one has none)."""
    if not any(m.get("role") in ("tool", "function") for m in body[live_start:]):
        return 0
    return len(rereads(observations(body, user_messages), masked, since=live_start))


def placeholder(observation: Observation, text: str) -> str:
    call = observation.call
    if call is not None:
        return TOOL_PLACEHOLDER.format(call=call, size=len(text))
    opening = short(text[: 4 * OPENING_CHARS], OPENING_CHARS)
    return OBSERVATION_PLACEHOLDER.format(size=len(text), opening=opening.replace('"', "'"))


def mask_candidates(
    nodes: Sequence[SurfaceNode],
    body: Sequence[Message],
    before: int,
    masker: Masker,
    masked: Callable[[int], bool],
) -> list[MaskCandidate]:
    """Every observation ``masker`` may clear before body position ``before``, oldest first.
    ``nodes`` is the surface (only its body and pruned nodes are offered), ``body`` the
    client's messages, ``masked(position)`` whether one is masked already."""
    found = observations(body, masker.user_messages)
    protected = {o.position for o in found[-masker.keep :]} if masker.keep else set()
    protected |= rereads(found, masked)
    by_position = {o.position: o for o in found}
    candidates: list[MaskCandidate] = []
    for node in nodes:
        position = node.start
        if node.kind not in ("body", "pruned") or position is None or position >= before:
            continue
        observation = by_position.get(position)
        if observation is None or position in protected or masked(position):
            continue
        if observation.tool is not None and observation.tool in masker.exclude_tools:
            continue
        text = text_of(body[position].get("content")) or ""
        line = placeholder(observation, text)
        if 2 * len(line) >= len(text_of(node.message.get("content")) or ""):
            continue
        candidates.append(MaskCandidate(position, line, observation.tool, len(text)))
    return candidates


class MaskCuts(NamedTuple):
    candidates: list[MaskCandidate]
    saved: int  # tokens, as the caller priced each placeholder against what it replaces


def oldest_masks(
    candidates: Sequence[MaskCandidate], savings: Sequence[int], need: int
) -> MaskCuts:
    """The fewest of ``candidates`` (oldest first, as ``mask_candidates`` gives them) that save
    ``need`` tokens, each worth its ``savings`` (``mask_savings``); all of them when together
    they save less. Consecutive requests clear the same oldest observations first, so a
    provider's prefix cache holds between them."""
    chosen: list[MaskCandidate] = []
    saved = 0
    for candidate, worth in zip(candidates, savings, strict=True):
        if saved >= need:
            break
        if worth > 0:
            chosen.append(candidate)
            saved += worth
    return MaskCuts(chosen, saved)


def mask_savings(
    nodes: Sequence[SurfaceNode],
    candidates: Sequence[MaskCandidate],
    price: Callable[[Message], int],
) -> list[int]:
    """What clearing each of ``candidates`` saves, ``price`` pricing a message as ``nodes``
    (the surface) shows it and as its placeholder would."""
    shown = {n.start: n.message for n in nodes if n.start is not None}
    savings = []
    for candidate in candidates:
        message = shown[candidate.position]
        savings.append(price(message) - price({**message, "content": candidate.placeholder}))
    return savings
