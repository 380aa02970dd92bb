"""Outbox rows the broker can never receive: failed at once, without harming their neighbours.

Against the real broker and database. A row is unpublishable when its message cannot be encoded
as AMQP (a message_id over 255 bytes, a header integer beyond 64 bits, an infinite number,
which RabbitMQ answers by closing the whole connection); the relay and the reconciler fail it
with the reason and go on.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from rabbitretry import Outbox, OutboxRelay, Topology
from rabbitretry.amqp import ConfirmingPublisher, Connection, connect
from rabbitretry.monitoring import heartbeat
from rabbitretry.reconcile.expected import Expected, Reconciliation
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import Exchange, declare
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import wait_for

pytestmark = pytest.mark.asyncio

LONG_ID = "x" * 300
LONG_ID_REASON = "message_id is 300 bytes; AMQP allows at most 255"


async def enqueue(
    pool: asyncpg.Pool,
    message_id: str,
    routing_key: str,
    *,
    exchange: str = "",
    headers: dict[str, Any] | None = None,
    ordering_key: str | None = None,
) -> None:
    async with pool.acquire() as conn:
        await Outbox().enqueue(
            conn,
            exchange,
            {"id": message_id[:20]},
            routing_key=routing_key,
            message_id=message_id,
            headers=headers,
            ordering_key=ordering_key,
        )


async def enqueue_infinity(pool: asyncpg.Pool, message_id: str, routing_key: str) -> None:
    """A row whose header reads back as float('inf'). jsonb keeps any number exactly, and
    json.loads reads one with a fraction beyond 1e308 as infinite. Outbox.enqueue cannot
    write it (json.dumps writes Infinity, which jsonb refuses); another writer can."""
    huge = "1" + "0" * 310 + ".5"
    await pool.execute(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload, headers)"
        " VALUES ('', $1, $2, '\\x7b7d', $3::jsonb)",
        routing_key,
        message_id,
        f'{{"price": {huge}}}',
    )


async def rows_by_id(pool: asyncpg.Pool) -> dict[str, asyncpg.Record]:
    rows = await pool.fetch("SELECT * FROM rabbitretry.outbox ORDER BY id")
    return {row["message_id"]: row for row in rows}


async def drain(amqp_url: str, queue: str) -> list[str]:
    """Take every message off ``queue``: their message_ids, in order."""
    connection = await aio_pika.connect(amqp_url)
    ids: list[str] = []
    try:
        channel = await connection.channel()
        source = await channel.declare_queue(queue, passive=True)
        while (message := await source.get(fail=False)) is not None:
            ids.append(str(message.message_id))
            await message.ack()
    finally:
        await connection.close()
    return ids


async def test_unpublishable_rows_fail_at_once_and_the_rest_of_their_batch_is_sent_once(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    await enqueue(pool, "good-1", work_queue)
    await enqueue(pool, LONG_ID, work_queue)
    await enqueue(pool, "good-2", work_queue)
    await enqueue(pool, "big-int", work_queue, headers={"count": 2**70})
    await enqueue(pool, "good-3", work_queue)
    await enqueue_infinity(pool, "infinite", work_queue)
    await enqueue(pool, "good-4", work_queue)
    relay = OutboxRelay(pool, amqp_url, max_tries=5, initial_backoff=60.0)

    assert await relay.relay_once(publisher) == 7
    assert publisher.available  # the infinity never reached the broker to close the connection
    rows = await rows_by_id(pool)
    assert {key: (row["status"], row["tries"]) for key, row in rows.items()} == {
        "good-1": ("sent", 1),
        LONG_ID: ("failed", 1),
        "good-2": ("sent", 1),
        "big-int": ("failed", 1),
        "good-3": ("sent", 1),
        "infinite": ("failed", 1),
        "good-4": ("sent", 1),
    }
    assert rows[LONG_ID]["last_error"] == LONG_ID_REASON
    assert rows["big-int"]["last_error"] == (
        "header 'count' holds the integer 1180591620717411303424, which does not fit in the "
        "64-bit signed integer AMQP allows"
    )
    assert rows["infinite"]["last_error"] == (
        "header 'price' is infinite: RabbitMQ closes the publishing connection on a NaN or "
        "infinite number"
    )
    assert (relay.stats.sent, relay.stats.unpublishable, relay.stats.failed_tries) == (4, 3, 0)

    assert await relay.relay_once(publisher) == 0  # failed rows are not tried again
    assert sorted(await drain(amqp_url, work_queue)) == ["good-1", "good-2", "good-3", "good-4"]


async def test_an_unpublishable_row_does_not_hold_back_later_rows_of_its_ordering_key(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str
) -> None:
    await enqueue(pool, LONG_ID, work_queue, ordering_key="order-7")
    await enqueue(pool, "order-7-shipped", work_queue, ordering_key="order-7")
    await enqueue(pool, "order-7-delivered", work_queue, ordering_key="order-7")
    relay = OutboxRelay(pool, amqp_url, poll_interval=0.1)
    task = asyncio.create_task(relay.run())
    try:

        async def settled() -> bool:
            statuses = [row["status"] for row in (await rows_by_id(pool)).values()]
            return statuses == ["failed", "sent", "sent"]

        await wait_for(settled, timeout=15)
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)
    assert (await rows_by_id(pool))[LONG_ID]["last_error"] == LONG_ID_REASON
    assert await drain(amqp_url, work_queue) == ["order-7-shipped", "order-7-delivered"]


async def test_rows_sharing_a_message_id_are_told_apart_when_one_is_returned_unroutable(
    amqp_url: str,
    pool: asyncpg.Pool,
    work_queue: str,
    publisher: ConfirmingPublisher,
    unbound_exchange: str,
) -> None:
    """aiormq matches a basic.return to its publish by message_id: two such publishes in flight
    at once on one channel would swap their outcomes (the returned one marked sent)."""
    nowhere = unbound_exchange
    # Both orders: the unroutable row first, then the routable one first.
    await enqueue(pool, "same-1", "no.queue", exchange=nowhere)
    await enqueue(pool, "same-1", work_queue)
    await enqueue(pool, "same-2", work_queue)
    await enqueue(pool, "same-2", "no.queue", exchange=nowhere)
    relay = OutboxRelay(pool, amqp_url, max_tries=3, initial_backoff=60.0)

    assert await relay.relay_once(publisher) == 4
    rows = await pool.fetch(
        "SELECT message_id, exchange, status, tries, last_error FROM rabbitretry.outbox ORDER BY id"
    )
    # The unroutable rows keep the unroutable policy: a failed try, backed off.
    assert [(r["message_id"], r["exchange"], r["status"], r["tries"]) for r in rows] == [
        ("same-1", nowhere, "pending", 1),
        ("same-1", "", "sent", 1),
        ("same-2", "", "sent", 1),
        ("same-2", nowhere, "pending", 1),
    ]
    assert all("no queue is bound" in r["last_error"] for r in rows if r["exchange"])
    assert sorted(await drain(amqp_url, work_queue)) == ["same-1", "same-2"]  # once each


async def test_the_reconciler_fails_an_unpublishable_stuck_row_and_goes_on_with_its_run(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str
) -> None:
    await enqueue(pool, LONG_ID, work_queue)
    await enqueue(pool, "stuck-ok", work_queue)
    await enqueue(pool, "bad-exchange", "anything", exchange="orders!")
    await pool.execute("UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 minute'")

    async def paid_orders(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        yield Expected("order-1", {"n": 1})  # never published: the run must get this far

    expected = Reconciliation("paid", work_queue, paid_orders, lookback=600, settle=0)
    reconciler = Reconciler(pool, amqp_url, grace=1.0, reconciliations=[expected])
    try:
        report = await reconciler.run_once()
    finally:
        await reconciler.close()

    assert report.outbox_published == 1
    assert report.windows[0].republished == 1
    assert len(report.errors) == 2
    assert any(LONG_ID_REASON in error for error in report.errors)
    rows = await rows_by_id(pool)
    assert {key: (row["status"], row["tries"]) for key, row in rows.items()} == {
        LONG_ID: ("failed", 1),
        "stuck-ok": ("sent", 1),
        "bad-exchange": ("failed", 1),
    }
    assert rows[LONG_ID]["last_error"] == LONG_ID_REASON
    assert rows["bad-exchange"]["last_error"].startswith("exchange name 'orders!' is not one")
    assert sorted(await drain(amqp_url, work_queue)) == ["order-1", "stuck-ok"]
    (beat,) = await heartbeat.read_all(pool)
    assert beat.counts["errors"] == 2 and beat.counts["outbox_published"] == 1


async def test_a_row_whose_exchange_does_not_exist_fails_alone_and_stops_nothing(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    """The broker closes the channel on a publish to a missing exchange (404), failing every
    publish in flight on it. It was taken for a lost connection: the row stayed pending, its
    tries uncounted, led every batch and closed the channel under its neighbours for good.
    Now the exchange is looked up first, and the row alone fails, after its budget of tries."""
    missing = f"{work_queue}.missing"
    await enqueue(pool, "good-1", work_queue)
    await enqueue(pool, "lost", "k", exchange=missing)
    for n in range(2, 6):
        await enqueue(pool, f"good-{n}", work_queue)
    relay = OutboxRelay(pool, amqp_url, max_tries=2, initial_backoff=0.0, max_backoff=0.0)

    assert await relay.relay_once(publisher) == 6
    rows = await rows_by_id(pool)
    assert {key: (row["status"], row["tries"]) for key, row in rows.items()} == {
        "good-1": ("sent", 1),
        "lost": ("pending", 1),  # a counted try: the exchange may yet be declared
        **{f"good-{n}": ("sent", 1) for n in range(2, 6)},
    }
    assert rows["lost"]["last_error"] == (
        f"the broker refused message 'lost': exchange '{missing}' does not exist"
    )
    assert (relay.stats.sent, relay.stats.failed_tries) == (5, 1)

    await enqueue(pool, "good-6", work_queue)
    assert await relay.relay_once(publisher) == 2  # its budget spent, the row is failed
    rows = await rows_by_id(pool)
    assert (rows["lost"]["status"], rows["lost"]["tries"]) == ("failed", 2)
    assert rows["good-6"]["status"] == "sent"
    assert sorted(await drain(amqp_url, work_queue)) == [f"good-{n}" for n in range(1, 7)]


async def test_a_row_whose_headers_do_not_fit_in_a_frame_fails_alone_and_closes_nothing(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    """A header table over the connection's frame_max made RabbitMQ close the connection:
    the whole batch failed as a lost connection, the row stayed pending, uncounted, and did
    the same on every pass. It is content: failed at once, and its neighbours are sent."""
    await enqueue(pool, "good-1", work_queue)
    await enqueue(pool, "huge", work_queue, headers={"big": "x" * 200_000})
    await enqueue(pool, "good-2", work_queue)
    relay = OutboxRelay(pool, amqp_url, max_tries=5, initial_backoff=60.0)

    assert await relay.relay_once(publisher) == 3
    assert publisher.available
    rows = await rows_by_id(pool)
    assert {key: (row["status"], row["tries"]) for key, row in rows.items()} == {
        "good-1": ("sent", 1),
        "huge": ("failed", 1),
        "good-2": ("sent", 1),
    }
    assert "more than one frame of this connection holds" in rows["huge"]["last_error"]
    assert sorted(await drain(amqp_url, work_queue)) == ["good-1", "good-2"]


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def user_who_may_not_write_to(amqp_url: str) -> Iterator[Callable[[str], str]]:
    """``make(exchange)``: the URL of a new user of the test's vhost with every permission but
    writing to ``exchange``; the users are deleted afterwards. Made with rabbitmqctl (the broker
    of this machine, as in CI)."""
    parts = urlsplit(amqp_url)
    local = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if not (local and shutil.which("rabbitmqctl")):
        message = "making a user needs rabbitmqctl and the broker on this machine"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true)", pytrace=False)
        pytest.skip(message)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    made: list[str] = []

    def make(exchange: str) -> str:
        user, password = f"rabbitretry-test-{secrets.token_hex(4)}", secrets.token_hex(12)
        _rabbitmqctl("add_user", user, password)
        made.append(user)
        _rabbitmqctl(
            "set_permissions", "-p", vhost, user, ".*", f"^(?!{re.escape(exchange)}$).*", ".*"
        )
        host = f"{parts.hostname}:{parts.port or 5672}"
        return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))

    yield make
    for user in made:
        _rabbitmqctl("delete_user", user)


async def test_a_row_for_an_exchange_the_user_may_not_write_to_fails_alone(
    pool: asyncpg.Pool,
    amqp_url: str,
    work_queue: str,
    amqp_connection: Connection,
    broker_cleanup: BrokerCleanup,
    user_who_may_not_write_to: Callable[[str], str],
) -> None:
    """403 ACCESS_REFUSED closes the channel like a 404: the row names the exchange, counts a
    try with the broker's words, and fails after its budget; its neighbours are sent, and the
    connection stays up."""
    forbidden = f"{work_queue}.forbidden"
    await declare(
        amqp_connection,
        broker_cleanup.topology(Topology(exchanges=[Exchange(name=forbidden, type="fanout")])),
    )
    channel = await amqp_connection.channel()
    await (await channel.declare_queue(work_queue, passive=True)).bind(forbidden)
    url = user_who_may_not_write_to(forbidden)
    await enqueue(pool, "good-1", work_queue)
    await enqueue(pool, "denied", "", exchange=forbidden)
    await enqueue(pool, "good-2", work_queue)
    relay = OutboxRelay(pool, url, max_tries=2, initial_backoff=0.0, max_backoff=0.0)
    connection = await connect(url)
    try:
        publisher = await ConfirmingPublisher.open(connection)
        assert await relay.relay_once(publisher) == 3
        rows = await rows_by_id(pool)
        assert {key: (row["status"], row["tries"]) for key, row in rows.items()} == {
            "good-1": ("sent", 1),
            "denied": ("pending", 1),
            "good-2": ("sent", 1),
        }
        user = urlsplit(url).username
        assert rows["denied"]["last_error"] == (
            f"the broker refused message 'denied': ACCESS_REFUSED - access to exchange "
            f"'{forbidden}' in vhost '/' refused for user '{user}'"
        )
        await enqueue(pool, "good-3", work_queue)
        assert await relay.relay_once(publisher) == 2
        assert publisher.available
    finally:
        await connection.close()
    rows = await rows_by_id(pool)
    assert (rows["denied"]["status"], rows["denied"]["tries"]) == ("failed", 2)
    assert rows["good-3"]["status"] == "sent"
    # The exchange exists, so the denied row is sent and its 403 closes the channel under the
    # rows in flight beside it: they are sent again on a fresh one, and one the broker had
    # already taken arrives twice (consumers deduplicate by message_id).
    assert sorted(set(await drain(amqp_url, work_queue))) == ["good-1", "good-2", "good-3"]
