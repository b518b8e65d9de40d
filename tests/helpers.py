"""Helpers the end-to-end tests share: routes to the fake upstream, a chat request through the
real SDK, metric readings, the admin API, the Redis commands framed in C."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
import hiredis
import pytest
from prometheus_client import REGISTRY

from compaction_proxy.security.client_keys import digest_of
from compaction_proxy.store import redis_packing
from compaction_proxy.testing.prompt_cache import CacheRead
from tests.builders import agent_turns, system, user

if TYPE_CHECKING:
    import openai

    from tests.conftest import ProxyFactory, RunningProxy

# A policy under which pressure is relieved by pruning and summaries alone: for tests of the
# summary path, whose histories masking (on by default) would otherwise relieve first.
MASKING_OFF: dict[str, Any] = {"masking": {"enabled": False}}
# A policy billed as a provider that caches nothing bills: there masks pay at once, so tests of
# masking's mechanics see them whatever a caching provider's prices would choose.
UNCACHED: dict[str, Any] = {"pricing": {"preset": "none"}}


def route(
    upstream_url: str,
    model: str,
    window: int | None = None,
    *,
    api_key_env: str | None = None,
    **policy: Any,
) -> dict[str, Any]:
    """One route to the fake upstream: the ``model`` pattern, its ``context_window`` when
    given, the key it holds when named, and ``policy`` overrides when there are any."""
    entry: dict[str, Any] = {"model": model, "base_url": upstream_url}
    if window is not None:
        entry["context_window"] = window
    if api_key_env is not None:
        entry["api_key_env"] = api_key_env
    if policy:
        entry["policy"] = policy
    return entry


def counter(name: str, **labels: str) -> float:
    """A metric's value in this process's registry (0 before its first event)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def chat(
    base_url: str, messages: list[dict[str, Any]], model: str, key: str = "sk-test", **extra: Any
) -> Any:
    """One chat completion through the real openai SDK; the raw response (headers and all)."""
    import openai  # the SDK is a test extra: a test module that uses it skips without it

    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
        return await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            **extra,
        )


# -- the admin API -------------------------------------------------------------------------

ADMIN_TOKEN = "admin-secret-0123456789"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN_MODEL = "fake-model"


def admin_history() -> list[dict[str, Any]]:
    return [
        system(),
        user(f"FACT-3: job {uuid.uuid4().hex[:6]}. Fix the race in the cache."),
        *agent_turns(8, output="cache trace " * 60),
        user("What now?"),
    ]


async def conversation_of(
    proxy: RunningProxy,
    messages: list[dict[str, Any]],
    session: str | None = None,
    api_key: str = "sk-c",
) -> str:
    import openai

    headers = {"X-Session-Id": session} if session else {}
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key=api_key, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=ADMIN_MODEL,
            messages=messages,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        return str(raw.headers["x-compaction-conversation"])


async def admin(
    proxy: RunningProxy,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(
            method,
            f"{proxy.root}/admin{path}",
            headers=ADMIN_AUTH if headers is None else headers,
            **kwargs,
        ) as response:
            body = await response.json() if response.content_type == "application/json" else None
            return response.status, body


def admin_routes(upstream_url: str) -> list[dict[str, Any]]:
    return [route(upstream_url, "fake-*", 64_000)]


# -- two tenants ---------------------------------------------------------------------------

ALICE, BOB = "cpk-alice-0123456789", "cpk-bob-0123456789"  # client keys


AGENT_KEY = "cpk-agent-0123456789"  # an agent's client key, behind ``holding_the_key``
HELD_KEY = "sk-held-by-the-proxy"


async def holding_the_key(
    make_proxy: ProxyFactory,
    upstream_url: str,
    monkeypatch: pytest.MonkeyPatch,
    pattern: str,
    window: int,
    account_endpoints: str = "owned",
) -> RunningProxy:
    """The proxy as a shared gateway for an agent: a route for ``pattern`` holding the upstream
    key (``HELD_KEY``), and ``AGENT_KEY`` the one client key."""
    monkeypatch.setenv("UPSTREAM_KEY", HELD_KEY)
    held = route(upstream_url, pattern, window, api_key_env="UPSTREAM_KEY")
    return await make_proxy(
        routes=[held | {"account_endpoints": account_endpoints}],
        client_key_digests=[digest_of(AGENT_KEY)],
    )


async def keyed(
    make_proxy: ProxyFactory, upstream_url: str, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> RunningProxy:
    """The proxy holding the upstream key (for requests of no model too), two client keys."""
    monkeypatch.setenv("UPSTREAM_KEY", "sk-held-by-the-proxy")
    account = {k: v for k, v in settings.items() if k == "account_endpoints"}
    return await make_proxy(
        routes=[route(upstream_url, "*", api_key_env="UPSTREAM_KEY") | account],
        upstream_api_key_env="UPSTREAM_KEY",
        client_key_digests=[digest_of(ALICE), digest_of(BOB)],
        **settings,
    )


@asynccontextmanager
async def alice_and_bob(
    proxy: RunningProxy,
) -> AsyncIterator[tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]]:
    """SDK clients for the two client keys."""
    import openai

    async with (
        openai.AsyncOpenAI(base_url=proxy.url, api_key=ALICE, max_retries=0) as alice,
        openai.AsyncOpenAI(base_url=proxy.url, api_key=BOB, max_retries=0) as bob,
    ):
        yield alice, bob


# -- the provider's prompt cache ----------------------------------------------------------


def assert_summary_calls_read_the_conversations_cache(prompts: list[CacheRead]) -> None:
    """A summary call is made as the conversation's next request would be: the provider
    reads nearly all of it from the cache the conversation's requests wrote."""
    summaries = [p for p in prompts if p.summary]
    assert summaries
    for summary in summaries:
        assert summary.read >= 0.9 * summary.prompt, summary


def framed_in_c(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The names of the Redis commands hiredis frames whole from here on
    (``store.redis_packing``), in order; the frames themselves made as before."""
    framed: list[object] = []

    def spy(args: tuple[Any, ...]) -> bytes:
        framed.append(args[0])
        packed: bytes = hiredis.pack_command(args)
        return packed

    monkeypatch.setattr(redis_packing, "_packed_in_c", spy)
    return framed
