"""``account_endpoints: owned``: each client key reaches only the objects it created (pure).

Under a key the proxy holds, every client spends one upstream account, and what the account
keeps (files, uploads, batches, vector stores, stored responses and completions, ...) is
everyone's unless the proxy keeps apart what each client made. In ``owned`` mode it does: the
ids in the answers that create objects are recorded as the creating tenant's (the store keeps
them for ``store_ttl_seconds``), a request that addresses an object (``/v1/files/{id}``,
``previous_response_id``) is served only to its owner, and other tenants get the 404 the API
gives for an id that does not exist. Lists are filtered to the caller's own objects. What a
body names (``security.object_references``) is checked the same way as what a path addresses.

Every function here reads plain data: the request's path and template, the answer's JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

MAX_OBJECT_ID = 256  # longer is no id the API makes: never owned, so never served

# POST templates whose answer is the created object (its ``id``).
_CREATES = frozenset(
    {
        "/v1/files",
        "/v1/uploads",
        "/v1/batches",
        "/v1/vector_stores",
        "/v1/conversations",
        "/v1/responses",
        "/v1/chat/completions",
        "/v1/fine_tuning/jobs",
        "/v1/assistants",
        "/v1/threads",
        "/v1/evals",
        "/v1/containers",
        "/v1/messages/batches",
    }
)

# GET templates that list the account's objects of one kind: answered with the caller's only.
LISTS = frozenset(
    {
        "/v1/files",
        "/v1/batches",
        "/v1/vector_stores",
        "/v1/chat/completions",
        "/v1/fine_tuning/jobs",
        "/v1/assistants",
        "/v1/evals",
        "/v1/containers",
        "/v1/messages/batches",
    }
)


def served_when_owned(template: str, method: str) -> bool:
    """Whether ``owned`` mode can serve a request: it addresses an object (checked against its
    owner), creates one (recorded) or lists them (filtered). Anything else is refused, as a
    path of no known template is."""
    if "{id}" in template:
        return True
    return (method == "POST" and template in _CREATES) or (method == "GET" and template in LISTS)


# (the kind before an ``{id}``, the kind before that) where the id is an item within its
# parent, which the upstream resolves only there: a thread's messages and runs, a run's steps,
# a conversation's items, a container's files, an eval's runs, a vector store's file batches.
# Every other ``{id}`` of a path is an object of the account (a vector store's file is a file).
_CONTAINED = frozenset(
    {
        ("messages", "threads"),
        ("runs", "threads"),
        ("steps", "runs"),
        ("items", "conversations"),
        ("files", "containers"),
        ("runs", "evals"),
        ("file_batches", "vector_stores"),
    }
)


def addressed_objects(path: str, template: str) -> list[str]:
    """The account's objects a request's path addresses: the segment at each of its
    template's ``{id}`` (``/v1/vector_stores/{id}/files/{id}`` names a vector store and a
    file), but for items named within their parent (``_CONTAINED``): the parent's check
    covers them, since the upstream looks them up in that parent alone."""
    wanted = template.removeprefix("/v1/").split("/")
    segments = [s for s in path.removeprefix("/v1/").split("/") if s]
    found = []
    for index, part in enumerate(wanted):
        if part != "{id}" or index >= len(segments):
            continue
        kind = wanted[index - 1] if index >= 1 else ""
        parent = wanted[index - 3] if index >= 3 else ""
        if (kind, parent) not in _CONTAINED:
            found.append(segments[index])
    return found


def is_object_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_OBJECT_ID


# Answers that show the items of a response or conversation the caller owns (checked before
# it was served): a later Responses input may name each item (``item_reference``), so each is
# the caller's too. Their items are the answer's ``output``, its ``data``, or the answer itself.
_ITEMS_IN_OUTPUT = frozenset({("/v1/responses", "POST"), ("/v1/responses/{id}", "GET")})
_ITEMS_IN_DATA = frozenset(
    {
        ("/v1/responses/{id}/input_items", "GET"),
        ("/v1/conversations/{id}/items", "GET"),
        ("/v1/conversations/{id}/items", "POST"),
    }
)
_ITEM = ("/v1/conversations/{id}/items/{id}", "GET")


def created_objects(template: str, method: str, answer: Any) -> list[str]:
    """The ids an answer makes its caller the owner of: a created object's, an upload's file
    once it is complete, a batch's output and error files as they appear, and the items of a
    response or conversation of theirs."""
    if not isinstance(answer, Mapping):
        return []
    found: list[Any] = []
    if method == "POST" and template in _CREATES:
        found.append(answer.get("id"))
    if (template, method) in _ITEMS_IN_OUTPUT and isinstance(answer.get("output"), list):
        found += [item.get("id") for item in answer["output"] if isinstance(item, Mapping)]
    elif (template, method) in _ITEMS_IN_DATA:
        found += listed_objects(answer)
    elif (template, method) == _ITEM:
        found.append(answer.get("id"))
    elif template == "/v1/uploads/{id}/complete":
        file = answer.get("file")
        found.append(file.get("id") if isinstance(file, Mapping) else None)
    if template.startswith("/v1/batches/{id}") or template == "/v1/batches":
        found += [answer.get("output_file_id"), answer.get("error_file_id")]
    return [value for value in found if is_object_id(value)]


def listed_objects(answer: Any) -> list[str]:
    """The ids a list answer holds (``data[].id``)."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("data"), list):
        return []
    return [item["id"] for item in answer["data"] if isinstance(item, Mapping) and "id" in item]


def own_list(answer: Mapping[str, Any], owned: Callable[[Any], bool]) -> dict[str, Any]:
    """A list answer with only the caller's objects; ``first_id``/``last_id`` follow. A page
    may then hold fewer than its ``limit`` while ``has_more`` holds: the client pages on."""
    data = [
        item
        for item in answer.get("data", [])
        if isinstance(item, Mapping) and owned(item.get("id"))
    ]
    kept = {**answer, "data": data}
    if "first_id" in kept:
        kept["first_id"] = data[0].get("id") if data else None
    if "last_id" in kept:
        kept["last_id"] = data[-1].get("id") if data else None
    return kept


def not_found_message(object_id: str) -> str:
    shown = object_id if len(object_id) <= 64 else object_id[:64] + "..."
    return f"No such object: {shown!r}."
