"""The request path's commands sent straight on a connection of redis-py's.

``Redis.execute_command`` wraps every command in machinery the request path's two scripts
(load and append, two commands a request) never use: the pool's lock taken twice, a data
check on the connection, event listeners and observability records on borrowing and on
giving back, a scan for ``HIMPORT``, a response-callback lookup. On Redis 8.2's client that
was about 1,000 bytecodes a command, 8 % of a request on Redis.

``DirectCommands`` keeps the parts that matter and skips the rest. The connections are
redis-py's (its connecting, handshake, TLS and authentication, its framing, its parser and
its error replies), borrowed from the client's own pool, so ``store_pool_size`` bounds them
with every other command's; up to half the pool is kept borrowed between commands and the
rest given back. Several commands go in one round trip as a pipeline does (a log pack's frame
and script, an append with the activity index), their replies read in order. A failed
connection or read is tried once more on the same connection (reconnected), under the retry
policy the client was given.

Invariant: a connection kept between commands is either disconnected or has no answer left
unread. Every reply is read whole, an error reply included (raised once all are read); any
other way out (a lost connection, running out of time, a cancellation at any await)
disconnects it, so a late answer never reaches the next caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT

CommandBatch = Sequence[Sequence[EncodableT]]  # commands sent in one round trip


class DirectCommands:
    """Commands sent on connections borrowed from ``pool`` (not a Cluster's: its commands go
    to the node owning their keys)."""

    __slots__ = ("_borrowed", "_idle", "_keep", "_pool")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        # Counted in the pool's connections in use until given back (redis-py leaves it untyped).
        self._borrowed: Callable[[], AbstractConnection] = pool.get_available_connection
        self._idle: list[AbstractConnection] = []
        self._keep = pool.max_connections // 2

    async def run(self, *command: EncodableT) -> Any:
        """The reply to ``command`` (an error reply raised as redis-py raises it)."""
        (reply,) = await self.run_all(command)
        return reply

    async def run_all(self, *commands: Sequence[EncodableT]) -> list[Any]:
        """The replies to ``commands``, sent in one round trip; the first error reply is
        raised once every reply is read."""
        # The pool refuses past its bound (MaxConnectionsError), as for any other command.
        connection = self._idle.pop() if self._idle else self._borrowed()
        try:
            if len(commands) == 1:  # the request path's every command but a pack's
                frame = connection.pack_command(*commands[0])
            else:
                frame = [piece for each in commands for piece in connection.pack_command(*each)]
            replies = await connection.retry.call_with_retry(
                lambda: _sent(connection, frame, len(commands)),
                lambda _error: _dropped(connection),
            )
        except BaseException:
            await _dropped(connection)
            raise
        finally:
            if len(self._idle) < self._keep:
                self._idle.append(connection)
            else:
                await self._pool.release(connection)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    async def run_with_script(
        self, script: AsyncScript, commands: Callable[[], CommandBatch]
    ) -> list[Any]:
        """``run_all(*commands())``, where one of the commands calls ``script`` by its digest.
        A server that lost its scripts (restarted, flushed) answers NOSCRIPT: the script is
        loaded again the same way (at a full pool the client's own ``script_load`` finds no
        connection) and the commands, made again with the new digest, sent once more. The
        others must bear being sent twice: the script never ran, they did."""
        try:
            return await self.run_all(*commands())
        except NoScriptError:
            script.sha = await self.run("SCRIPT LOAD", script.script)
            return await self.run_all(*commands())

    async def close(self) -> None:
        """Gives every kept connection back to the pool (which disconnects them on close)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._pool.release(connection)


async def _sent(connection: AbstractConnection, frame: list[bytes], count: int) -> list[Any]:
    await connection.send_packed_command(frame, check_health=False)  # connects when it must
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except ResponseError as refused:  # read whole: the next reply follows it
            replies.append(refused)
    return replies


async def _dropped(connection: AbstractConnection) -> None:
    """Disconnected, whatever it had sent or read: the next command connects afresh."""
    await connection.disconnect(nowait=True)
