"""Long histories through the real openai SDK, without its walk over every parameter.

Before sending, the SDK walks each parameter against its typed-dict unions (to rename aliased
keys and format dates). For a replayed agent history of hundreds of messages that walk was two
thirds of a replay test's time, and for chat messages and Responses items it changes nothing.
Handed over as ``extra_body``, the history goes out through the same client (its HTTP layer,
headers, retries, response parsing) in the same body:
``test_a_history_handed_over_unwalked_is_the_body_the_sdk_sends`` holds the two to the same
JSON, key order included."""

from __future__ import annotations

from typing import Any


def unwalked(name: str, history: list[Any]) -> dict[str, Any]:
    """Keyword arguments of a ``create`` call that send ``history`` as its ``name`` parameter
    (``messages``, ``input``): the SDK sends ``extra_body`` over its own, as it is."""
    return {name: [], "extra_body": {name: history}}
