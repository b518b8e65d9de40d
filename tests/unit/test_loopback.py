"""The vouch a WebSocket frame's request to this process carries for its client (pure)."""

from __future__ import annotations

import pytest

from compaction_proxy.config.settings import LOOPBACK_SECRET_ENV
from compaction_proxy.ops import workers
from compaction_proxy.security.loopback import LoopbackVouch

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

VOUCH = LoopbackVouch(b"s" * 32)


@given(st.text())
def test_a_vouch_names_the_address_it_was_made_for(address: str) -> None:
    assert VOUCH.address_in(VOUCH.header_for(address)) == address


@given(st.text(), st.text())
def test_no_header_a_client_can_make_without_the_secret_names_an_address(
    address: str, forged: str
) -> None:
    assert LoopbackVouch(b"t" * 32).address_in(VOUCH.header_for(address)) is None
    assert VOUCH.address_in(forged) is None


def test_workers_given_one_secret_accept_each_others_vouches() -> None:
    environment = {LOOPBACK_SECRET_ENV: "shared"}
    one, other = (LoopbackVouch.from_environment(environment) for _ in range(2))
    assert other.address_in(one.header_for("10.0.0.7")) == "10.0.0.7"
    alone, apart = (LoopbackVouch.from_environment({}) for _ in range(2))
    assert apart.address_in(alone.header_for("10.0.0.7")) is None


async def test_every_worker_a_supervisor_starts_gets_its_one_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: list[str] = []

    async def spawned(*_: object, env: dict[str, str], **__: object) -> object:
        given.append(env[LOOPBACK_SECRET_ENV])
        raise OSError("not started here")

    monkeypatch.setattr(workers.asyncio, "create_subprocess_exec", spawned)
    supervisor = workers.Supervisor(3, [], 1.0)
    for _ in range(3):
        with pytest.raises(OSError):
            await supervisor._spawn()
    assert len(given) == 3 and len(set(given)) == 1 and len(given[0]) == 64
