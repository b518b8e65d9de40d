"""Commands of bytes framed by hiredis in one call, every other command as redis-py frames it."""

from __future__ import annotations

import pytest
from redis._parsers.encoders import Encoder
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import DataError

from compaction_proxy.store import redis_packing
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.store.redis_forms import as_argument
from compaction_proxy.store.redis_packing import bytes_packing

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

# As the store configures its connections: a log segment read back as text holds surrogates.
OPTIONS = {"encoding_errors": "surrogateescape"}
NAMES = st.sampled_from(["EVALSHA", "SET", "evalsha", "CLIENT SETNAME", "SCRIPT LOAD", "É"])
ARGUMENTS = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=16),
    st.integers(),
    st.floats(allow_nan=False),
    st.binary(max_size=16).map(memoryview),
)


def framed(connection: AbstractConnection, *args: object) -> bytes:
    return b"".join(connection.pack_command(*args))  # type: ignore[arg-type]


@given(NAMES, st.lists(st.binary(max_size=200), max_size=30))
def test_a_command_of_bytes_is_framed_as_redis_py_frames_it(name: str, args: list[bytes]) -> None:
    ours, theirs = bytes_packing(Connection)(**OPTIONS), Connection(**OPTIONS)
    assert framed(ours, name, *args) == framed(theirs, name, *args)


@given(NAMES, st.lists(ARGUMENTS, max_size=8))
def test_any_other_command_is_framed_as_redis_py_frames_it(name: str, args: list[object]) -> None:
    ours, theirs = bytes_packing(Connection)(**OPTIONS), Connection(**OPTIONS)
    assert framed(ours, name, *args) == framed(theirs, name, *args)


def test_what_redis_py_refuses_is_still_refused() -> None:
    with pytest.raises(DataError):
        framed(bytes_packing(Connection)(**OPTIONS), "SET", b"key", True)
    with pytest.raises(DataError):
        framed(bytes_packing(Connection)(**OPTIONS), "SET", b"key", object())


def test_each_kind_of_connection_keeps_its_kind_and_packs_bytes_itself() -> None:
    for kind in (Connection, SSLConnection, UnixDomainSocketConnection):
        packing = bytes_packing(kind)
        assert issubclass(packing, kind) and packing.__name__ == kind.__name__
        assert packing.pack_command is not kind.pack_command


def test_the_stores_request_path_commands_are_framed_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[object, ...]] = []

    def spy(args: tuple[object, ...]) -> bytes:
        calls.append(args)
        return b""

    monkeypatch.setattr(redis_packing, "_packed_in_c", spy)
    store = RedisStore("redis://127.0.0.1:1/0")  # never connected: a connection is only made
    connection = store._client.connection_pool.make_connection()  # type: ignore[union-attr]
    connection.pack_command("EVALSHA", b"0" * 40, b"1", b"key", b"argument")
    connection.pack_command("SET", "key", "text")  # strings: redis-py's own packer
    assert calls == [("EVALSHA", b"0" * 40, b"1", b"key", b"argument")]


@given(st.one_of(st.binary(max_size=64), st.text(max_size=32), st.integers()))
def test_an_argument_as_bytes_is_what_redis_pys_encoder_sends(value: bytes | str | int) -> None:
    encoder = Encoder("utf-8", "surrogateescape", decode_responses=False)
    assert as_argument(value) == encoder.encode(value)


def test_a_read_byte_that_is_not_utf8_goes_back_as_it_came() -> None:
    assert as_argument(b"\xff".decode("utf-8", "surrogateescape")) == b"\xff"
