"""The console's message page says how the recover hook's run went, as ``dead show`` does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from rabbitretry.console import Auth, ConsoleConfig
from rabbitretry.ledger import recover_hooks
from rabbitretry.topology import names
from tests.integration.console_harness import TOKEN, console_client, insert_dead, log_in

pytestmark = pytest.mark.asyncio

RECOVER_QUEUE = names.recover_queue("orders")


@pytest.fixture
async def client(database_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with console_client(config) as http:
        await log_in(http)
        yield http


async def insert_run(
    pool: asyncpg.Pool,
    of: str,
    *,
    status: str,
    attempts: int,
    reason: str | None = None,
    error: tuple[str, str] | None = None,
) -> str:
    """The ledger row of a run of the hook for dead message ``of`` of queue ``orders``."""
    run_id = f"recover:{of}:0"
    error_type, error_message = error or (None, None)
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " reason, error_type, error_message, next_retry_at, finished_at, payload, headers)"
        " VALUES ($1, $2, $3, $4, 5, $5, $6, $7,"
        " CASE WHEN $3 = 'retrying' THEN now() + interval '1 minute' END,"
        " CASE WHEN $3 IN ('succeeded', 'dead') THEN now() END, '{}', $8)",
        RECOVER_QUEUE,
        run_id,
        status,
        attempts,
        reason,
        error_type,
        error_message,
        json.dumps({"x-rabbitretry-recover-of": of}),
    )
    return run_id


async def message_page(client: httpx.AsyncClient, queue: str, message_id: str) -> str:
    page = await client.get("/message", params={"queue": queue, "id": message_id})
    assert page.status_code == 200, page.text
    return page.text


async def test_the_page_shows_the_run_and_links_to_it(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await recover_hooks.register(pool, "orders", RECOVER_QUEUE)
    await insert_dead(pool, "orders", "o-1", b'{"order": 1}')
    run_id = await insert_run(
        pool, "o-1", status="succeeded", attempts=2, error=("ConnectionError", "refund down")
    )

    page = await message_page(client, "orders", "o-1")
    assert "Recover hook" in page
    assert '<span class="status succeeded">succeeded</span>' in page
    assert "after 2 runs" in page
    assert "refund down" not in page  # a run that succeeded shows no last error
    link = "/message?queue=orders.recover&amp;id=recover%3Ao-1%3A0"
    assert f'<a href="{link}">{run_id}</a>' in page
    run_page = await message_page(client, RECOVER_QUEUE, run_id)
    assert "Recover hook" not in run_page  # the run's own queue has no hook


async def test_a_failing_run_shows_its_last_error(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await recover_hooks.register(pool, "orders", RECOVER_QUEUE)
    await insert_dead(pool, "orders", "o-2", b'{"order": 2}')
    await insert_dead(pool, "orders", "o-3", b'{"order": 3}')
    await insert_run(
        pool, "o-2", status="retrying", attempts=1, error=("ConnectionError", "<b>refund</b> down")
    )
    await insert_run(
        pool,
        "o-3",
        status="dead",
        attempts=5,
        reason="attempts-exhausted",
        error=("ConnectionError", "still down"),
    )

    retrying = await message_page(client, "orders", "o-2")
    assert '<span class="status retrying">retrying</span>' in retrying
    assert "after 1 run," in retrying
    assert "last error" in retrying
    assert "ConnectionError: &lt;b&gt;refund&lt;/b&gt; down" in retrying  # escaped
    dead = await message_page(client, "orders", "o-3")
    assert '<span class="status dead">dead</span> (attempts-exhausted)' in dead
    assert "after 5 runs, last error" in dead and "ConnectionError: still down" in dead


async def test_nothing_is_shown_without_a_hook_or_a_run(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "o-4", b'{"order": 4}')
    await insert_run(pool, "o-4", status="succeeded", attempts=1)
    assert "Recover hook" not in await message_page(client, "orders", "o-4")  # not registered

    await recover_hooks.register(pool, "orders", RECOVER_QUEUE)
    await insert_dead(pool, "orders", "o-5", b'{"order": 5}')
    assert "Recover hook" in await message_page(client, "orders", "o-4")
    assert "Recover hook" not in await message_page(client, "orders", "o-5")  # no run yet
