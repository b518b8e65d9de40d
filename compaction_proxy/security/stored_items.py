"""Input items and skill entries that stand for stored objects of the account (pure).

A Responses input item can name a stored item: an ``item_reference`` is read as the item it
names (the Vercel AI SDK sends one for each earlier answer while ``store`` is on), and a
``reasoning`` item with an ``id`` and no ``encrypted_content`` as the reasoning kept under that
id. Both are looked for among the top-level ``input`` items only, the only place the API reads
them. A skill the account keeps is mounted by its ``skill_id``: OpenAI's ``skill_reference`` in
a tool's ``environment``, Anthropic's ``custom`` skill in a ``container`` (Anthropic's own
skills, of type ``anthropic``, are nobody's objects).

Each search also says whether a field given twice could make another parser read another name,
from what the byte scan of ``security.object_references`` counted (``ScannedWords``): then the
caller parses the body again exactly, looking for repeats. Names are ``(field, id)`` pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any, Protocol

import orjson

Named = tuple[str, str]  # the field naming an object, and its id ("" for no id: nobody's)


class ScannedWords(Protocol):
    """What the byte scan saw: each word with its offset, and whether any key was escaped."""

    @property
    def keys(self) -> Sequence[tuple[str, int]]: ...

    @property
    def escapes(self) -> Sequence[int]: ...

    def count(self, word: str) -> int: ...


# Strings whose presence means an input item may name a stored item, or a skill entry mount
# one of the account's skills: the two item types that name one, the field that makes a
# reasoning item carry its own content instead, and the field that names a skill.
ITEM_REFERENCE = "item_reference"
REASONING = "reasoning"
ENCRYPTED = "encrypted_content"
SKILL_ID = "skill_id"
ITEM_MARKS = frozenset({ITEM_REFERENCE, REASONING, ENCRYPTED, SKILL_ID})
# The fields of such an item or skill that decide what it names: given twice in one object,
# a 400.
ITEM_KEYS = frozenset({"type", "id", ENCRYPTED, SKILL_ID})
# The skill entries that mount one of the account's skills.
_ACCOUNT_SKILLS = frozenset({"skill_reference", "custom"})


def stored_items_named(body: Any, seen: ScannedWords, raw: bytes = b"") -> tuple[list[Named], bool]:
    """The stored items ``body``'s top-level ``input`` names, and whether a field given twice
    could make another parser read another name: an item that may name one (its ``id`` could
    stand twice) unless its bytes in ``raw`` are the plain two-field object an SDK writes, or
    a parse that reads fewer or more of those items and ``encrypted_content`` fields than the
    scan of the bytes saw (a ``type`` or an ``encrypted_content`` given twice). One pass over
    the items; Codex's, whose reasoning carries its content, and the Vercel AI SDK's
    references, need no more."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return [], False  # no input items: nothing the API reads as one (a chat body, say)
    named = []
    candidates = references = reasoning = encrypted = 0
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        encrypted += ENCRYPTED in item
        has_content = item.get(ENCRYPTED) is not None
        if kind == ITEM_REFERENCE:
            references += 1
            named.append(_item_named(item.get("id")))
        elif kind == REASONING:
            reasoning += 1
            candidates += not has_content
            if "id" in item and item["id"] is not None and not has_content:
                named.append(_item_named(item["id"]))
    reasoning += REASONING in body  # the ``reasoning`` option
    as_scanned = (
        not seen.escapes
        and references == seen.count(ITEM_REFERENCE)
        and reasoning == seen.count(REASONING)
        and encrypted == seen.count(ENCRYPTED)
    )
    if as_scanned and references:
        marks = [at for key, at in seen.keys if key == ITEM_REFERENCE]
        ids = [object_id for _, object_id in named[:references]] if not candidates else []
        plain = len(ids) == len(marks) and all(map(_plain_reference, repeat(raw), marks, ids))
        candidates += 0 if plain else references
    return named, bool(candidates) or not as_scanned


# An item reference as SDKs write it, compact (JavaScript's JSON.stringify) or with Python's
# default separators: two fields, so neither can stand twice.
_PLAIN_REFERENCES = (
    (b'{"type":', b',"id":', b"}"),
    (b'{"type": ', b', "id": ', b"}"),
)


def _plain_reference(raw: bytes, mark: int, object_id: str) -> bool:
    """Whether the ``"item_reference"`` string at ``mark`` in ``raw`` is the type of a plain
    reference object naming ``object_id``."""
    name = orjson.dumps(object_id)
    for opening, separator, closing in _PLAIN_REFERENCES:
        start = mark - len(opening)
        whole = opening + b'"item_reference"' + separator + name + closing
        if start >= 0 and raw.startswith(whole, start):
            return True
    return False


def _item_named(value: Any) -> Named:
    return ("input", value if isinstance(value, str) else "")


def skills_named(body: Any, seen: ScannedWords) -> tuple[list[Named], bool]:
    """The account's skills ``body`` mounts, and whether a field given twice could make
    another parser read another: any skill entry (its ``type`` could stand twice), or a
    ``skill_id`` the scan saw where no skill entry is."""
    lists: list[Any] = []
    if isinstance(body, dict):
        tools = body.get("tools")
        for tool in tools if isinstance(tools, list) else []:
            environment = tool.get("environment") if isinstance(tool, dict) else None
            if isinstance(environment, dict):
                lists.append(environment.get("skills"))
        container = body.get("container")
        if isinstance(container, dict):
            lists.append(container.get("skills"))
    named = []
    entries = 0
    for skills in lists:
        for skill in skills if isinstance(skills, list) else []:
            if not isinstance(skill, dict) or SKILL_ID not in skill:
                continue
            entries += 1
            kind = skill.get("type")
            if isinstance(kind, str) and kind in _ACCOUNT_SKILLS:
                value = skill[SKILL_ID]
                named.append((SKILL_ID, value if isinstance(value, str) else ""))
    return named, bool(entries) or bool(seen.escapes) or entries != seen.count(SKILL_ID)
