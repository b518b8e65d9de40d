"""Connections that hand a command of bytes to hiredis whole.

redis-py's packer runs its encoder in Python for every argument, bytes included (a generator
step, an encoder call and its type checks: about 45 bytecodes an argument). The request path's
two scripts already send theirs as bytes (``RedisStore._evalsha``; the load's command is 10
words, the append's 21 and eight a message logged, one an event, two an attribute: 57 on
django-13265's mean): redis-py's packing of them was about 1,750 bytecodes a request when the
append was 22 words, 6 % of a request on Redis. ``hiredis.pack_command`` frames the same bytes
in one C call, on one Redis and on a Cluster's nodes alike.

Only a command named by one ASCII word (``"EVALSHA"``: redis-py splits a name holding a space)
whose every argument is ``bytes`` takes the short way; any other (strings, numbers,
memoryviews) is redis-py's as before, its encoding and its errors included. The frame is byte
for byte what redis-py writes for the same command (a property test holds both to it).
"""

from __future__ import annotations

from typing import TypeVar, cast

from hiredis import pack_command as _packed_in_c
from redis.asyncio.connection import AbstractConnection
from redis.typing import EncodableT

_BYTES_ONLY = frozenset({bytes})

ConnectionT = TypeVar("ConnectionT", bound=AbstractConnection)


def bytes_packing(connection_class: type[ConnectionT]) -> type[ConnectionT]:
    """``connection_class`` (a plain, TLS or Unix-socket connection of redis-py's) with a
    command of bytes packed by hiredis in one call."""

    def pack_command(self: ConnectionT, *args: EncodableT) -> list[bytes]:
        name = args[0] if args else None
        if (
            type(name) is str
            and name.isascii()
            and name.isalpha()
            and _BYTES_ONLY.issuperset(map(type, args[1:]))
        ):
            return [_packed_in_c(args)]  # type: ignore[arg-type]  # its stub: a 1-tuple
        return connection_class.pack_command(self, *args)

    namespace = {"pack_command": pack_command, "__doc__": connection_class.__doc__}
    return cast(type[ConnectionT], type(connection_class.__name__, (connection_class,), namespace))
