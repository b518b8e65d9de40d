"""Conversations that begin alike, without a session id (one conversation id: the first
message's), compact side by side: none waits for another's summary, none reads another's
checkpoint, and each goes on with its own."""

from __future__ import annotations

import asyncio
from typing import Any

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction import ask, routes

TWINS = 5


def twin_history(twin: int) -> list[dict[str, Any]]:
    """The same opening message for every twin; from then on, a history of its own."""
    return [
        system(),
        user("FACT-1: hi. Make the importer idempotent."),
        user(f"FACT-2: twin {twin} keeps its notes in /srv/twin-{twin}."),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
    ]


async def test_twins_compact_at_once_and_each_keeps_its_own_checkpoint(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url))
    histories = [twin_history(twin) for twin in range(TWINS)]
    fake.summary_delay = 0.5
    replies = await asyncio.gather(*(ask(proxy.url, history) for history in histories))
    assert [r.headers["x-compaction-status"] for r in replies] == ["compacted"] * TWINS
    # Every twin's summary call was in flight at once: none waited on another's lease.
    assert fake.most_summaries_at_once == TWINS
    assert len(fake.summary_requests) == TWINS
    assert len({r.headers["x-compaction-conversation"] for r in replies}) == 1

    fake.summary_delay = 0
    for twin, history in enumerate(histories):
        more = [*history, {"role": "assistant", "content": "On it."}, user("And now?")]
        reply = await ask(proxy.url, more)
        assert reply.headers["x-compaction-status"] == "compacted"  # its checkpoint, reused
        sent = str(fake.chat_requests[-1].body)
        assert f"twin {twin} keeps its notes" in sent
        others = [other for other in range(TWINS) if other != twin]
        assert not any(f"twin {other} keeps its notes" in sent for other in others)
    assert len(fake.summary_requests) == TWINS
