"""A TCP proxy that records what clients write to PostgreSQL, write by write: to test that
statements reach the server in the writes jobpool means them to; and that can go silent, to
test what a client does with a connection that no longer answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
from psycopg.conninfo import make_conninfo

SYNC = b"S\x00\x00\x00\x04"
"""The protocol's Sync message: the server answers everything sent before it."""


@contextlib.asynccontextmanager
async def recording_proxy(dsn: str, *, silent: asyncio.Event | None = None
                          ) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A TCP proxy in front of `dsn`'s server: a DSN through it, and the chunks the clients'
    writes arrive in, in order (a write of a few hundred bytes arrives as one). While
    `silent` is set, the server's answers do not reach the clients (a partition: the
    connections stay open, silent)."""
    async with await psycopg.AsyncConnection.connect(dsn) as probe:
        host, port = probe.info.host, probe.info.port
    chunks: list[bytes] = []
    pumps: set[asyncio.Task[None]] = set()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   record: bool) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if record:
                    chunks.append(data)
                elif silent is not None and silent.is_set():
                    continue
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if host.startswith("/"):
            server_r, server_w = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            server_r, server_w = await asyncio.open_connection(host, port)
        pumps.update({asyncio.create_task(pump(client_r, server_w, True)),
                      asyncio.create_task(pump(server_r, client_w, False))})

    proxy = await asyncio.start_server(serve, "127.0.0.1", 0)
    proxy_port = proxy.sockets[0].getsockname()[1]
    try:
        yield make_conninfo(dsn, host="127.0.0.1", port=proxy_port, sslmode="disable",
                            gssencmode="disable"), chunks
    finally:
        proxy.close()
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
