"""Which relayed endpoints reach the upstream account itself (pure).

When the proxy holds the upstream key, every client spends one account. A stateless endpoint
(embeddings, moderations, audio, images, completions, token counts, the model list, a Realtime
session) answers each request from that request alone. Every other one reads or changes what
the account keeps (files, uploads, batches, vector stores, stored responses and completions,
fine-tuning, assistants, evals...): through a shared key, one client would read, list or
delete another's. Those are refused unless the route says the account is shared
(``account_endpoints: shared``, for a single-team deployment) or kept apart by owner
(``account_endpoints: owned``: each client key reaches only what it created, see
``security.owned_objects``). A path of no known template is taken for an account endpoint:
refused is the safe guess.
"""

from __future__ import annotations

from typing import Literal

from compaction_proxy.security.owned_objects import served_when_owned

AccountEndpoints = Literal["refused", "shared", "owned"]

# (template, method or "*") that answer from the request alone.
_STATELESS = frozenset(
    {
        ("/v1/models", "GET"),
        ("/v1/models/{id}", "GET"),
        ("/v1/embeddings", "POST"),
        ("/v1/moderations", "POST"),
        ("/v1/completions", "POST"),
        ("/v1/audio/speech", "POST"),
        ("/v1/audio/transcriptions", "POST"),
        ("/v1/audio/translations", "POST"),
        ("/v1/images/generations", "POST"),
        ("/v1/images/edits", "POST"),
        ("/v1/images/variations", "POST"),
        ("/v1/responses/input_tokens", "POST"),
        ("/v1/responses/compact", "POST"),
        ("/v1/messages", "POST"),  # Anthropic's Messages: the history comes with the request
        ("/v1/messages/count_tokens", "POST"),
        ("/v1/realtime", "GET"),  # a session over a WebSocket, kept by nobody after it
    }
)

SETTING = "account_endpoints"


def is_stateless(template: str, method: str) -> bool:
    return (template, method) in _STATELESS


def refused_account_endpoint(
    template: str, method: str, holds_key: bool, account_endpoints: AccountEndpoints
) -> bool:
    """Whether a relayed request is refused: the proxy holds the key it would be sent with,
    the endpoint reaches what the account keeps, and the route does not share the account."""
    if not holds_key or account_endpoints == "shared" or (template, method) in _STATELESS:
        return False
    return account_endpoints != "owned" or not served_when_owned(template, method)


REFUSAL = (
    "This endpoint reaches what the upstream account keeps (files, batches, stored responses "
    "...), and the proxy's key for that account is shared by every client: it is refused. "
    f"Set {SETTING}: owned on the route to give each client key its own objects, or "
    f"{SETTING}: shared for a single-team deployment."
)
