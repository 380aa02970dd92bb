"""The WMS of the outage drill: a small asyncio HTTP server on 127.0.0.1 (a free port).

It accepts every shipment (HTTP 200), or answers 500 while ``down``, each after ``latency``
seconds (a real service takes a moment, and it lets two calls in flight at once show). It
records every request: when it came (wall-clock time, comparable with PostgreSQL's), whether
the WMS was down, the order, and how many requests it was serving at that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

LATENCY = 0.02  # seconds the WMS takes to answer
MAX_HEADER_LINES = 100


@dataclass(frozen=True)
class Request:
    at: float
    """Wall-clock time (``time.time()``) of its arrival."""
    down: bool
    order: str
    in_flight: int
    """Requests being served at its arrival, itself included."""


@dataclass
class StubWms:
    latency: float = LATENCY
    down: bool = False
    requests: list[Request] = field(default_factory=list)
    in_flight: int = 0
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> StubWms:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def while_down(self) -> list[Request]:
        return [r for r in self.requests if r.down]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._answer(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # a client gone (a worker stopped mid-call): nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = await reader.readline()
        if not request_line:
            return
        length = 0
        for _ in range(MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        self.in_flight += 1
        try:
            down = self.down
            self.requests.append(Request(time.time(), down, _order_of(body), self.in_flight))
            await asyncio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        status = b"500 Internal Server Error" if down else b"200 OK"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()


def _order_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["order_id"])
    except (ValueError, KeyError, TypeError):
        return "?"
