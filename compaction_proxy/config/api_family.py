"""Whose conventions a request follows, for what the layers below the formats must know of it.

A wire format (``formats.wire``) belongs to one family. The family, not the format, decides
what routing, credentials and prices follow from the provider: an Anthropic-family request
whose model no route matches goes to ``anthropic_base_url``, carries a route's key as
``x-api-key``, and is priced on Anthropic's cache terms under ``pricing.preset: auto``.
"""

from __future__ import annotations

from enum import StrEnum


class ApiFamily(StrEnum):
    OPENAI = "openai"  # chat completions, the Responses API, and the providers that copy them
    ANTHROPIC = "anthropic"  # the Messages API
