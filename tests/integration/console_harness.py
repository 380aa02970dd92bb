"""A console for tests: the app over a test database, and dead letters written straight in."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator

import asyncpg
import httpx

from rabbitretry.console import ConsoleConfig, create_app
from rabbitretry.ledger import failures

TOKEN = "test-token-0123456789"
BASE = "http://console.test"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@contextlib.asynccontextmanager
async def console_client(
    config: ConsoleConfig, base: str = BASE
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the console in-process (its lifespan started and ended)."""
    app = create_app(config)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base) as http,
    ):
        yield http


async def post(client: httpx.AsyncClient, path: str, data: dict[str, str]) -> httpx.Response:
    """A form posted as the console's own pages post it (from its origin)."""
    return await client.post(path, data=data, headers={"origin": str(client.base_url)})


async def log_in(client: httpx.AsyncClient, name: str = "alice") -> None:
    response = await post(client, "/login", {"token": TOKEN, "name": name})
    assert response.status_code == 303, response.text


async def insert_dead(
    pool: asyncpg.Pool,
    queue: str,
    message_id: str,
    payload: bytes,
    *,
    error: str = "order 1 not found",
) -> None:
    """A dead letter as the worker would leave it after one failed attempt."""
    described = failures.rejection(queue, "Permanent", error)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
            " reason, error_type, error_message, error_fingerprint, finished_at, payload,"
            " headers) VALUES ($1, $2, 'dead', 1, 3, 'permanent-error', 'Permanent', $3, $4,"
            " now(), $5, $6)",
            queue,
            message_id,
            error,
            described.fingerprint,
            payload,
            json.dumps({"x-note": "<i>header</i>"}),
        )
        await conn.execute(
            "INSERT INTO rabbitretry.attempt (queue, message_id, attempt, finished_at, outcome,"
            " error_type, error_message, error_traceback, worker)"
            " VALUES ($1, $2, 1, now(), 'dead', 'Permanent', $3, $4, 'test-worker')",
            queue,
            message_id,
            error,
            f"Traceback (most recent call last):\n  Permanent: {error}",
        )


async def insert_many_dead(
    conn: asyncpg.Connection | asyncpg.Pool,
    count: int,
    *,
    queues: int = 1,
    groups: int = 1,
    prefix: str = "q-",
) -> None:
    """``count`` dead letters in one statement: keys ``m-000001``..., spread round-robin over
    ``queues`` queues (``q-0``...) and ``groups`` fingerprints (``fp-0``...), one a second."""
    await conn.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " reason, error_type, error_message, error_fingerprint, first_seen, finished_at,"
        " updated_at, payload)"
        " SELECT $4 || (n % $2), 'm-' || lpad(n::text, 6, '0'), 'dead', 1 + n % 5, 5,"
        " 'permanent-error', 'Permanent', 'order ' || n || ' not found', 'fp-' || (n % $3),"
        " t, t, t, convert_to('{\"order\": ' || n || '}', 'UTF8')"
        " FROM generate_series(1, $1) AS n,"
        " LATERAL (SELECT now() - make_interval(secs => $1 - n) AS t) AS at",
        count,
        queues,
        groups,
        prefix,
    )


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF token in the page"
    return match[1]
