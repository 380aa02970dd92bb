"""A PostgreSQL that keeps the connection but stops answering (a partition, a hung server) is an
outage within a bound: the callback receiver answers 503 within its ``store_timeout`` and
recovers by itself when the database answers again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from rabbitretry.callbacks import CallbackReceiver
from tests.integration.test_callbacks import body_of, client_for, kind_for, outbox_rows, post
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio
STORE_TIMEOUT = 2.0
POOL_SIZE = 2
# What the test allows over the bound: scheduling on a busy 2-core machine, never a
# statement timeout (60 s) or a connect timeout (60 s).
SLACK = 1.0


@pytest.fixture
async def database_proxy(database_url: str) -> AsyncIterator[Proxy]:
    """A TCP proxy in front of PostgreSQL that can stall (``proxy.url_for(database_url)``)."""
    parts = urlsplit(database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield proxy
    await proxy.close()


async def timed_post(http: httpx.AsyncClient, body: bytes) -> tuple[httpx.Response, float]:
    """The answer and how long it took; a failure (not a wait) when it takes far too long."""
    started = time.monotonic()
    async with asyncio.timeout(STORE_TIMEOUT * 10):  # the test fails, it does not hang
        response = await post(http, body)
    return response, time.monotonic() - started


async def test_a_silent_database_is_503_within_the_store_timeout_and_recovers(
    database_url: str, database_proxy: Proxy, pool: asyncpg.Pool, queue_name: str
) -> None:
    receiver = CallbackReceiver(
        [kind_for(queue_name)],
        database_url=database_proxy.url_for(database_url),
        pool_size=POOL_SIZE,
        store_timeout=STORE_TIMEOUT,
    )
    async with client_for(receiver) as http:
        assert (await post(http, body_of("t1"))).status_code == 200
        database_proxy.stall()
        # More requests than the pool has connections, one after another: a request that
        # timed out must not leave its connection in the pool, tied up or broken.
        transactions = [f"s{n}" for n in range(POOL_SIZE + 1)]
        for transaction in transactions:
            response, took = await timed_post(http, body_of(transaction))
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "5"
            assert took < STORE_TIMEOUT + SLACK, f"503 after {took:.1f} s"
        # And together: the whole pool waiting at once is still bounded.
        together = await asyncio.gather(*(timed_post(http, body_of(t)) for t in transactions))
        assert [r.status_code for r, _ in together] == [503] * len(transactions)
        assert max(took for _, took in together) < STORE_TIMEOUT + SLACK
        database_proxy.restore()
        # The gateway sends again: each is stored (or found stored, if a statement held by
        # the stall went through once the partition healed), with no restart.
        for transaction in transactions:
            response, took = await timed_post(http, body_of(transaction))
            assert response.status_code == 200, response.text
            assert took < STORE_TIMEOUT + SLACK
    keys = sorted(r["message_id"] for r in await outbox_rows(pool))
    assert keys == sorted(["pay-t1-paid", *(f"pay-{t}-paid" for t in transactions)])


async def test_a_database_silent_from_the_first_request_is_503_within_the_store_timeout(
    database_url: str, database_proxy: Proxy, pool: asyncpg.Pool, queue_name: str
) -> None:
    receiver = CallbackReceiver(
        [kind_for(queue_name)],
        database_url=database_proxy.url_for(database_url),
        store_timeout=STORE_TIMEOUT,
    )
    async with client_for(receiver) as http:
        database_proxy.stall()  # the receiver's pool is opened by the first request
        response, took = await timed_post(http, body_of("t1"))
        assert response.status_code == 503, response.text
        assert took < STORE_TIMEOUT + SLACK, f"503 after {took:.1f} s"
        database_proxy.restore()
        response, took = await timed_post(http, body_of("t1"))
        assert response.status_code == 200, response.text
    assert [r["message_id"] for r in await outbox_rows(pool)] == ["pay-t1-paid"]
