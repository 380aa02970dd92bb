"""The callback receiver's throughput: ``python -m bench.callbacks``.

``rabbitretry callbacks serve`` runs in its own process against a scratch database; this
process is the gateway: ``--clients`` concurrent HTTP clients post signed callbacks, each a new
transaction, and a fraction of them (``--duplicates``) a second time, as gateways retry. It
reports callbacks stored per second (200 "stored", committed before the answer) and the
response times of every request, then checks that the outbox holds one row per stored
callback and none for a duplicate.

For scale, it also runs the receiver's store statement alone, from as many connections as
there are clients: the rate the database allows, without HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from pydantic import BaseModel

from bench.services import scratch_database
from bench.stats import summary
from rabbitretry import db
from rabbitretry.callbacks import CallbackKind, HmacSignature

SECRET = "bench-secret"
SIGNATURE = HmacSignature(secret=SECRET)
ROOT = Path(__file__).resolve().parents[1]


class GatewayEvent(BaseModel):
    transaction_id: str
    order_id: str
    type: str
    amount: int


bench_callbacks = CallbackKind(
    name="payment",
    model=GatewayEvent,
    queue="bench.callbacks",
    message_id=lambda event: f"payment-{event.transaction_id}-{event.type}",
    signature=SIGNATURE,
)


@dataclass(frozen=True)
class Answer:
    status: int
    message: str
    seconds: float


def figures(answers: Sequence[Answer], wall_seconds: float) -> dict[str, float]:
    """Stored callbacks per second and the response times (ms) of all requests."""
    if wall_seconds <= 0:
        raise ValueError("wall_seconds must be positive")
    stored = sum(1 for a in answers if a.status == 200 and a.message == "stored")
    times = summary([a.seconds * 1000 for a in answers])
    return {
        "requests": len(answers),
        "stored": stored,
        "duplicates": sum(1 for a in answers if a.message == "duplicate"),
        "errors": sum(1 for a in answers if a.status != 200),
        "stored_per_second": stored / wall_seconds,
        "requests_per_second": len(answers) / wall_seconds,
        "p50_ms": times["p50"],
        "p95_ms": times["p95"],
        "p99_ms": times["p99"],
        "max_ms": times["max"],
    }


def bodies(count: int, duplicates: float) -> list[bytes]:
    """``count`` distinct callbacks, then every ``1/duplicates``-th of them again, interleaved."""
    if not 0 <= duplicates <= 1:
        raise ValueError("duplicates is a fraction within 0..1")
    distinct = [
        json.dumps(
            {"transaction_id": f"t{n}", "order_id": f"o{n}", "type": "paid", "amount": 100}
        ).encode()
        for n in range(count)
    ]
    every = round(1 / duplicates) if duplicates else 0
    result: list[bytes] = []
    for n, body in enumerate(distinct):
        result.append(body)
        if every and n % every == every - 1:
            result.append(distinct[n - every // 2])  # a retry of an earlier callback
    return result


async def post_all(url: str, payloads: list[bytes], clients: int) -> list[Answer]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in payloads:
        queue.put_nowait(body)
    answers: list[Answer] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:

        async def client() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                headers = {"content-type": "application/json"}
                headers |= SIGNATURE.headers(body, time.time())
                started = time.perf_counter()
                response = await http.post(url, content=body, headers=headers)
                elapsed = time.perf_counter() - started
                answers.append(Answer(response.status_code, response.json()["message"], elapsed))

        await asyncio.gather(*(client() for _ in range(clients)))
    return answers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(database_url: str) -> AsyncIterator[str]:
    """``rabbitretry callbacks serve`` in a process of its own; yields the callback URL."""
    port = free_port()
    env = os.environ | {"RABBITRETRY_DATABASE_URL": database_url}
    command = [sys.executable, "-m", "rabbitretry", "callbacks", "serve"]
    command += ["bench.callbacks:bench_callbacks", "--port", str(port)]
    process = await asyncio.create_subprocess_exec(*command, cwd=ROOT, env=env)
    try:
        await _until_listening(port, process)
        yield f"http://127.0.0.1:{port}/payment"
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def _until_listening(port: int, process: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"the receiver exited with {process.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the receiver did not listen within 30 s")


async def store_only(database_url: str, payloads: list[bytes], clients: int) -> float:
    """Stores per second of the receiver's statement alone (``clients`` connections)."""
    pool = await db.create_pool(database_url, min_size=clients, max_size=clients)
    pending = list(enumerate(payloads))
    headers = json.dumps({"rabbitretry-callback": "payment"})

    async def connection() -> None:
        while pending:
            n, body = pending.pop()
            await pool.fetchval(
                db.query("callback_store"),
                "store-only",
                f"k{n}",
                "bench.callbacks",
                body,
                headers,
                "application/json",
            )

    try:
        started = time.perf_counter()
        await asyncio.gather(*(connection() for _ in range(clients)))
        return len(payloads) / (time.perf_counter() - started)
    finally:
        await pool.close()


async def run(count: int, clients: int, duplicates: float) -> dict[str, float]:
    payloads = bodies(count, duplicates)
    async with scratch_database() as database_url, serving(database_url) as url:
        await post_all(url, payloads[: min(200, len(payloads))], clients)  # warm-up
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("TRUNCATE rabbitretry.outbox, rabbitretry.callback_receipt")
        finally:
            await conn.close()
        started = time.perf_counter()
        answers = await post_all(url, payloads, clients)
        result = figures(answers, time.perf_counter() - started)
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetchval("SELECT count(*) FROM rabbitretry.outbox")
        finally:
            await conn.close()
        if rows != result["stored"] or result["stored"] != count:
            raise RuntimeError(f"{count} callbacks, {result['stored']} stored, {rows} rows")
        statement_rate = await store_only(database_url, payloads[:count], clients)
    return result | {
        "clients": clients,
        "outbox_rows": rows,
        "statement_alone_per_second": statement_rate,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.callbacks", description=__doc__)
    parser.add_argument("--callbacks", type=int, default=5000, help="distinct callbacks")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients")
    parser.add_argument(
        "--duplicates", type=float, default=0.1, help="fraction of callbacks sent twice"
    )
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.callbacks, args.clients, args.duplicates))
    print(json.dumps(result, indent=2))
    print(
        f"{result['stored_per_second']:.0f} callbacks/s stored "
        f"({result['requests_per_second']:.0f} requests/s with duplicates), "
        f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
        f"{result['errors']:.0f} errors, {args.clients} clients; the store statement alone: "
        f"{result['statement_alone_per_second']:.0f}/s"
    )


if __name__ == "__main__":
    main()
