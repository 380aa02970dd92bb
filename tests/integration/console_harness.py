"""A console for tests: the app over a test database, and dead letters written straight in."""

from __future__ import annotations

import json
import re

import asyncpg

from rabbitretry import failure

TOKEN = "test-token-0123456789"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def insert_dead(
    pool: asyncpg.Pool,
    queue: str,
    message_id: str,
    payload: bytes,
    *,
    error: str = "order 1 not found",
) -> None:
    """A dead letter as the worker would leave it after one failed attempt."""
    described = failure.rejection(queue, "Permanent", error)
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


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF token in the page"
    return match[1]
