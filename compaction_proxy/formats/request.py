"""The request the shared core works on, whatever API it came in, and what every API's
parsing needs first.

A client request is a JSON object naming its ``model``. Each API's adapter (``formats.wire``)
validates its own body and gives the core the same thing: chat-shaped messages, and the
adapter itself as the way back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compaction_proxy.computed_once import computed_once
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio
from compaction_proxy.parsing.recent_bodies import Extension, Lineage, RecentBodies, first_of

if TYPE_CHECKING:
    from compaction_proxy.formats.wire import WireFormat


def invalid(param: str, expected: str, got: Any) -> BadRequest:
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(got)}.",
        param=param,
        code="invalid_type",
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


@frozen
class ClientRequest:
    """A validated body, as chat messages whatever API it came in. ``body`` is the client's
    object as parsed, never modified.

    ``wire`` is the API's adapter: the endpoint it goes to and how its surface is written
    back. For chat the ``messages`` are the body's own; for the others they are translated,
    ``groups[i]`` the body's entries ``messages[i]`` stands for (``formats.responses``,
    ``formats.anthropic``)."""

    body: dict[str, Any]
    raw: bytes  # the body as received (parsed with ``jsonio.loads_fast``), sent as is if unchanged
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    wire: WireFormat
    digests: list[str] | None = None  # each message's ``message_digest``, when computed
    groups: list[tuple[int, ...]] | None = None
    translation: Any = None  # the Messages translation (formats.anthropic_blocks)
    lineage: Lineage | None = None  # what it takes from a body it extends, leaves for the next
    # A window the request itself declares, in force instead of the model map's: Anthropic's
    # 1M-context beta (formats.anthropic.declared_window).
    declared_window: int | None = None
    # It holds a checkpoint the proxy sealed for the client (formats.sealed_checkpoints).
    carries_sealed: bool = False

    @property
    def api(self) -> str:
        """The API's name (``chat``, ``responses``, ``messages``): a metric label, logged."""
        return self.wire.name

    @property
    def stored(self) -> bool:
        """Whether the provider keeps the answer (``store``: Responses by default, chat only
        when asked), so the client may name it later."""
        return self.body.get("store", self.wire.stored_by_default) is True

    def lossless_body(self) -> dict[str, Any]:
        """The body, read again losslessly when it may hold integers beyond 64 bits (the
        parse kept for the core may have rounded them)."""
        return jsonio.loads(self.raw) if self.may_hold_a_big_integer() else self.body

    def may_hold_a_big_integer(self) -> bool:
        """Whether the body may hold an integer beyond 64 bits, which its orjson reading
        changed (see ``parsing.jsonio``). Scanned from where it differs from a remembered body
        found clean, and remembered as clean when it is (see ``Lineage``)."""
        lineage = self.lineage
        if jsonio.may_hold_a_big_integer(self.raw, 0 if lineage is None else lineage.clean_bytes):
            return True
        if lineage is not None and lineage.scanned is not None:
            lineage.scanned.clean = True
        return False

    @computed_once  # asked by the pressure and the rescue; the body never changes
    def answer_cap(self) -> int | None:
        """The most tokens the client lets the answer take, when it says (a positive integer
        in the API's field; anything else is the upstream's to refuse)."""
        for key in self.wire.answer_cap_fields:
            cap = self.body.get(key)
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                return cap
        return None


@frozen
class ProviderHeld:
    """A body whose history the provider holds (a Responses ``previous_response_id`` or
    ``conversation``): nothing to compact, relayed as sent."""

    body: dict[str, Any]
    raw: bytes
    model: str


def parse_object_with_model(raw: bytes) -> dict[str, Any]:
    """A JSON object naming its ``model`` as a string (what every API here needs first)."""
    try:
        body = jsonio.loads_fast(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return check_object_with_model(body)


MAX_MODEL_CHARS = 256  # far above any provider's model names; what a name may cost is bounded


def check_model_name(model: str) -> str:
    """``model`` if it is a name the proxy keeps (in caches, logs and labels), else a 400."""
    if len(model) > MAX_MODEL_CHARS:
        raise BadRequest(
            f"The model name is {len(model)} characters long: at most {MAX_MODEL_CHARS}.",
            param="model",
        )
    return model


def check_object_with_model(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` if it names its ``model`` as a string of at most ``MAX_MODEL_CHARS``."""
    if "model" not in body:
        raise BadRequest("you must provide a model parameter", param="model")
    if not isinstance(body["model"], str):
        raise invalid("model", "a string", body["model"])
    check_model_name(body["model"])
    return body


def check_stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "a boolean", stream)
    return bool(stream)


def translated_digests(
    messages: list[dict[str, Any]],
    reused: int,
    extension: Extension | None,
    known: KnownMessages,
) -> list[str]:
    """Each translated message's digest: the first ``reused`` the remembered body's (the
    messages of its translation this body took), the rest hashed (validated as translated)."""
    digests = [] if extension is None else first_of(extension.base.digests, reused)
    digests += known.digests(messages[reused:], _validated)
    return digests


def remembered(
    recent: RecentBodies | None,
    raw: bytes,
    body: dict[str, Any],
    name: str,
    digests: list[str],
    extension: Extension | None,
    translation: Any,
    reused: int,
    hint: str | None,
) -> Lineage | None:
    """The body remembered with its translation, so the next body extending it starts from
    here (``RecentBodies.remember``), when its array ``name`` is a list."""
    elements = body.get(name)
    if recent is None or not isinstance(elements, list):
        return None
    return recent.remember(raw, elements, digests, name, extension, translation, reused, hint=hint)


def _validated(message: dict[str, Any], index: int) -> None:
    """A translated message was validated as it was translated."""
