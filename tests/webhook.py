"""A webhook receiver on 127.0.0.1 for alert tests: refuses the first N posts, then accepts."""

from __future__ import annotations

import asyncio
import json
from typing import Any


class WebhookReceiver:
    def __init__(self, fail_first: int = 0, status: int = 503) -> None:
        self.fail_first = fail_first
        self.status = status
        self.requests = 0
        self.accepted: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    path = "/hooks/T0/secret-token"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    async def start(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests += 1
            self.paths.append(lines[0].split(" ")[1])
            if self.requests <= self.fail_first:
                status = f"{self.status} Refused"
            else:
                self.accepted.append(json.loads(body))
                status = "200 OK"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        finally:
            writer.close()
