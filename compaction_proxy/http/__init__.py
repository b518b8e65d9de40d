"""The edge: HTTP handlers for chat, Responses and every other ``/v1/`` path, the upstream
relay, request intake, the admin API and the inspector page. The only layer (with ``ops``)
that knows aiohttp's server; it hands each request to ``service`` with one ``Services``."""
