"""The stored objects a request body names, wherever it names them (pure).

Under a key the proxy holds, a request that names an object the account keeps (a file, a
vector store, a stored response, a container...) reaches that object whatever endpoint it goes
to: a chat ``file`` part quotes the file, a batch over an ``input_file_id`` reads it, a vector
store made with ``file_ids`` serves them, ``previous_response_id`` on ``/responses/compact``
returns the response's text. So every body is searched, at any depth, for the fields the APIs
name objects by (``NAMING_KEYS``); the edge then binds the request to the account
(``security.account_endpoints``, ``http.ownership``).

A Responses input item can name a stored item too: an ``item_reference`` is read as the item
it names (the Vercel AI SDK sends one for each earlier answer while ``store`` is on), and a
``reasoning`` item with an ``id`` and no ``encrypted_content`` is read as the reasoning kept
under that id. So does a skill the account keeps, mounted by its ``skill_id``. Both are found
by ``security.stored_items``, where the scan saw their marks.

Payloads the upstream never reads as references are not searched: a tool call's arguments, a
JSON schema, ``metadata``, and the ``input`` of an Anthropic tool use (an agent's own tool
may well take a ``file_id``).

A field the proxy reads for such a decision, or for routing (``model``, ``stream``), given
twice in one JSON object is refused: the proxy's parser keeps the last value, and an upstream
whose parser keeps the first would act on another value than the one checked
(``duplicated_key``). Both searches start with one regular expression over the bytes, so a body
that names nothing costs a scan, not a walk.
"""

from __future__ import annotations

import email.policy
import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from email.parser import BytesParser
from typing import Any

from compaction_proxy.frozen import frozen
from compaction_proxy.security.stored_items import (
    ITEM_KEYS,
    ITEM_MARKS,
    ITEM_REFERENCE,
    REASONING,
    SKILL_ID,
    skills_named,
    stored_items_named,
)

# Fields whose string value is one object's id.
_ID_KEYS = frozenset(
    {
        "file_id",
        "input_file_id",
        "previous_response_id",
        "response_id",
        "vector_store_id",
        "training_file",
        "validation_file",
        "assistant_id",
        "thread_id",
        "batch_id",
        "upload_id",
        "container_id",
        "conversation_id",
    }
)
# Fields whose value is a list of ids.
_ID_LIST_KEYS = frozenset({"file_ids", "vector_store_ids"})
# Fields whose value is an id, or an object carrying it as ``id``.
_HOLDER_KEYS = frozenset({"conversation", "container"})
NAMING_KEYS = _ID_KEYS | _ID_LIST_KEYS | _HOLDER_KEYS
# Multipart endpoints whose form fields may name stored objects (a container's file by
# ``file_id``): their bodies are read and searched before they go. Every other multipart body
# (a file's bytes, an audio clip) is streamed as it comes.
FORMS_NAMING_OBJECTS = frozenset({"/v1/containers/{id}/files"})
# Fields read for a decision: given twice in one object, a 400.
_ROUTING_KEYS = frozenset({"model", "stream"})
DECISION_KEYS = NAMING_KEYS | _ROUTING_KEYS
# Values never read as references by the upstream: not searched.
_OPAQUE_KEYS = frozenset(
    {"metadata", "parameters", "input_schema", "schema", "json_schema", "arguments"}
)
# Maps of a client's own labels: ``metadata``, and Codex's ``client_metadata``, which names its
# session's ``thread_id`` (a thread of Codex's, no object of the account) on every request.
_OPAQUE_SUFFIX = "_metadata"

_KEY_NAMES = "|".join(sorted(re.escape(key) for key in DECISION_KEYS | ITEM_MARKS))
_KEYS = re.compile(rb'"(' + _KEY_NAMES.encode() + rb')"')
# A key spelled with an escaped letter or underscore (``"file\u005fid"``) reads as the same
# key once parsed, but no byte search sees it: such a body is searched the slow way.
_ESCAPED_LETTER = re.compile(rb"\\u00(?:5[fF]|[67][0-9a-fA-F])")


@frozen
class NamedObject:
    """An object a body names: ``param`` the field naming it, ``object_id`` its id as sent
    (``""`` when the field holds no string: no object anyone owns)."""

    param: str
    object_id: str


@frozen
class KeysSeen:
    """What one scan of a body's bytes found: each decision key spelled plainly, and each
    escaped letter (a key may be spelled with escapes), with their offsets, so that a body
    sharing a prefix with this one takes what lies there without scanning it again."""

    keys: tuple[tuple[str, int], ...]
    escapes: tuple[int, ...]

    @property
    def may_name_objects(self) -> bool:
        return bool(self.escapes) or any(key in NAMING_KEYS for key, _ in self.keys)

    @property
    def may_name_stored_items(self) -> bool:
        return bool(self.escapes) or self.count(ITEM_REFERENCE) + self.count(REASONING) > 0

    @property
    def may_mount_skills(self) -> bool:
        return bool(self.escapes) or self.count(SKILL_ID) > 0

    def count(self, word: str) -> int:
        """How many times ``word`` stands as a whole JSON string (key or value)."""
        return self._counts.get(word, 0)

    @functools.cached_property
    def _counts(self) -> Counter[str]:
        return Counter(key for key, _ in self.keys)

    @property
    def may_repeat_a_routing_key(self) -> bool:
        """Whether ``model`` or ``stream`` may stand twice in one object: seen twice anywhere,
        or some key is spelled with escapes."""
        if self.escapes:
            return True
        routing = [key for key, _ in self.keys if key in _ROUTING_KEYS]
        return len(routing) != len(set(routing))


def scan(raw: bytes, start: int = 0, earlier: KeysSeen | None = None) -> KeysSeen:
    """The decision keys and escapes of ``raw``, scanning from ``start``: what lies before it
    is taken from ``earlier``, the scan of a body whose first ``start`` bytes ``raw`` shares
    (ending at a message's closing brace, which no key or escape crosses)."""
    keys = [found for found in earlier.keys if found[1] < start] if earlier else []
    escapes = [at for at in earlier.escapes if at < start] if earlier else []
    keys += [(found.group(1).decode(), found.start()) for found in _KEYS.finditer(raw, start)]
    escapes += [found.start() for found in _ESCAPED_LETTER.finditer(raw, start)]
    return KeysSeen(tuple(keys), tuple(escapes))


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuser(keys: frozenset[str]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen and key in keys:
                raise DuplicateKey(key)
            seen.add(key)
        return dict(pairs)

    return refuse_duplicates


_DECISIONS = _refuser(DECISION_KEYS)
_DECISIONS_AND_ITEMS = _refuser(DECISION_KEYS | ITEM_KEYS)


def duplicated_key(raw: bytes, items: bool = False) -> str | None:
    """The first decision key that stands twice in one JSON object of ``raw``, if any (a
    whole parse by the standard library: called only when ``scan`` says it may be). With
    ``items``, an input item's or a skill entry's ``type``, ``id``, ``encrypted_content`` and
    ``skill_id`` count as decision keys (they decide whether it names a stored object)."""
    try:
        json.loads(raw, object_pairs_hook=_DECISIONS_AND_ITEMS if items else _DECISIONS)
    except DuplicateKey as duplicate:
        return duplicate.key
    except (ValueError, RecursionError):
        return None  # not JSON: its parse refuses it elsewhere
    return None


@frozen
class References:
    """What a body names (``named``), the scan that found it (kept for the next body that
    extends this one) and a decision field it gives twice in one object, if any."""

    seen: KeysSeen
    named: list[NamedObject]
    duplicated: str | None


def find_references(
    raw: bytes, body: Any, start: int = 0, earlier: KeysSeen | None = None
) -> References:
    """The stored objects ``body`` (parsed from ``raw``) names, and whether a decision field
    stands twice in one of its objects. The bytes are scanned from ``start`` (``scan``);
    the body is walked only where the scan saw a naming field, and its input items and skill
    entries looked at only where it saw their marks; the exact check for a repeated field (a
    whole parse) runs only where a repeat could matter: a routing field seen twice, an escaped
    key, a named object (whose field may hide a second value in its object; a naming field that
    only stands where nothing is read as a reference decides nothing), or an item or skill
    entry whose name a repeated field could change."""
    seen = scan(raw, start, earlier)
    named = _named_sparingly(body, seen) if seen.may_name_objects else []
    unsure = bool(named) or seen.may_repeat_a_routing_key
    if seen.may_name_stored_items:
        found, unsure_here = stored_items_named(body, seen, raw)
        named += [NamedObject(param, object_id) for param, object_id in found]
        unsure = unsure or unsure_here
    if seen.may_mount_skills:
        found, unsure_here = skills_named(body, seen)
        named += [NamedObject(param, object_id) for param, object_id in found]
        unsure = unsure or unsure_here
    repeated = None
    if unsure:
        items = seen.may_name_stored_items or seen.may_mount_skills
        repeated = duplicated_key(raw, items)
    return References(seen, named, repeated)


def named_objects(body: Any) -> list[NamedObject]:
    """Every object ``body`` names, in the order met (see the module's docstring)."""
    return list(_walk(body))


# A body's conversation: the list that holds nearly all of its bytes.
_CONVERSATION_LISTS = ("input", "messages")


def _named_sparingly(body: Any, seen: KeysSeen) -> list[NamedObject]:
    """``named_objects(body)``, walking the conversation's list only where a naming key the
    scan saw may stand in it: the other top-level fields are walked first, and when they hold
    every naming key the scan counted (Codex's ``client_metadata`` names a ``thread_id`` on
    every request), the list holds none. Escaped keys are not counted: the whole walk."""
    if not isinstance(body, dict):
        return named_objects(body)
    lists = [key for key in _CONVERSATION_LISTS if isinstance(body.get(key), list)]
    if seen.escapes or not lists:
        return named_objects(body)
    rest = {key: value for key, value in body.items() if key not in lists}
    if _naming_words(rest) != sum(seen.count(key) for key in NAMING_KEYS):
        return named_objects(body)
    return named_objects(rest)


def _naming_words(value: Any) -> int:
    """How many keys and string values in ``value`` are naming keys, everywhere, opaque
    fields included: what the scan of its bytes would count."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += sum(1 for key in item if key in NAMING_KEYS)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and item in NAMING_KEYS:
            count += 1
    return count


def _walk(body: Any) -> Iterator[NamedObject]:
    stack = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(reversed(value))
            continue
        if not isinstance(value, dict):
            continue
        tool_use = isinstance(value.get("type"), str) and value["type"].endswith("tool_use")
        later = []
        for key, item in value.items():
            if key in _OPAQUE_KEYS or key.endswith(_OPAQUE_SUFFIX) or (tool_use and key == "input"):
                continue
            if key in NAMING_KEYS:
                yield from _named_by(key, item)
            if isinstance(item, dict | list):
                later.append(item)
        stack.extend(reversed(later))


def _named_by(key: str, value: Any) -> Iterator[NamedObject]:
    if value is None:
        return  # clients send ``null`` for "none"
    if key in _ID_LIST_KEYS:
        for item in value if isinstance(value, list) else [value]:
            yield NamedObject(key, item if isinstance(item, str) else "")
    elif key in _HOLDER_KEYS and isinstance(value, dict):
        if "id" in value:
            held = value["id"]
            yield NamedObject(key, held if isinstance(held, str) else "")
    else:
        yield NamedObject(key, value if isinstance(value, str) else "")


def named_in_form(raw: bytes, content_type: str) -> list[NamedObject]:
    """The objects a ``multipart/form-data`` body names in its fields, each value of a field
    given twice included (a file part's bytes are data, never a reference). A body that
    cannot be read as a form names an object nobody owns: it fails closed."""
    try:
        form = BytesParser(policy=email.policy.default).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw
        )
        parts = list(form.iter_parts())
    except (ValueError, LookupError, UnicodeError):
        return [NamedObject("form", "")]
    if not parts:  # no part this parser can see: another parser might see some
        return [NamedObject("form", "")]
    found = []
    for part in parts:
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str) and name in NAMING_KEYS and part.get_filename() is None:
            payload = part.get_payload(decode=True)
            value = payload.decode("utf-8", "replace").strip() if isinstance(payload, bytes) else ""
            found.append(NamedObject(name, value))
    return found
