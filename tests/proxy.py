"""A TCP proxy on loopback that a test can cut, stall and restore, to drop a service mid-run
(``cut``: every connection closes) or to silence it (``stall``: connections stay open but no
byte goes through, as in a network partition or a hung server; ``stall(replies_only=True)``:
requests still reach the service, which acts on them, but its replies are held, as when a
connection dies after a commit and before its answer)."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.StreamWriter] = set()
        self._refusing = False
        # Set while bytes flow (to the service, and back); cleared by stall(). Bytes read while
        # one is clear are held and go through on restore(), as TCP delivers them once a
        # partition heals.
        self._requests_flow = asyncio.Event()
        self._replies_flow = asyncio.Event()
        self.restore()

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def cut(self, *, refuse: bool = False) -> None:
        """Close every connection through the proxy; with ``refuse``, also turn new ones away."""
        self._refusing = refuse
        for writer in list(self._pipes):
            writer.close()
        self._pipes.clear()

    def stall(self, *, replies_only: bool = False) -> None:
        """Keep every connection (and accept new ones) but forward no byte either way, or,
        with ``replies_only``, none from the service back to its clients."""
        self._replies_flow.clear()
        if not replies_only:
            self._requests_flow.clear()

    def restore(self) -> None:
        """Accept connections again and forward what a stall held back."""
        self._refusing = False
        self._requests_flow.set()
        self._replies_flow.set()

    async def close(self) -> None:
        await self.cut()
        self.restore()  # a stalled pump wakes, finds its writer closed and ends
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._pipes.update((writer, up_writer))
        await asyncio.gather(
            self._pump(reader, up_writer, self._requests_flow),
            self._pump(up_reader, writer, self._replies_flow),
            return_exceptions=True,
        )

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
    ) -> None:
        try:
            while data := await reader.read(65536):
                await flowing.wait()
                if writer.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._pipes.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()
