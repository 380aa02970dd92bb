"""The callback receiver against the real ledger and broker: every answer, and nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import httpx
import pytest
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.routing import Mount

from rabbitretry import Consumer, Context, RetryPolicy
from rabbitretry.callbacks import CallbackKind, CallbackReceiver, HmacSignature, StateMachine
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import running_worker, wait_for, wait_status
from tests.integration.test_outbox import running_relay
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio
BASE = "http://gateway.test"
SECRET = "s3cret"
SIGNATURE = HmacSignature(secret=SECRET)


class Event(BaseModel):
    transaction_id: str
    order_id: str
    type: Literal["paid", "closed", "refunding", "refunded"]


ORDER = StateMachine(
    name="order",
    table="cb_order",
    transitions={
        "pending": {"paid", "closed"},
        "paid": {"refunding", "refunded"},
        "refunding": {"refunded"},
    },
    retry_delay=0.5,
)


def event_key(event: Event) -> str:
    return f"pay-{event.transaction_id}-{event.type}"


def kind_for(queue: str, **options: Any) -> CallbackKind:
    return CallbackKind(
        name="payment",
        model=Event,
        queue=queue,
        message_id=event_key,
        signature=SIGNATURE,
        **options,
    )


def body_of(transaction: str = "t1", kind: str = "paid", order: str = "o1") -> bytes:
    return json.dumps({"transaction_id": transaction, "order_id": order, "type": kind}).encode()


def signed(body: bytes) -> dict[str, str]:
    return lowered({"content-type": "application/json", **SIGNATURE.headers(body, time.time())})


def lowered(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


@contextlib.asynccontextmanager
async def client_for(receiver: CallbackReceiver) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=receiver)
    try:
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            yield http
    finally:
        await receiver.close()


@pytest.fixture
async def receiver(pool: asyncpg.Pool, queue_name: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(CallbackReceiver([kind_for(queue_name)], pool=pool)) as http:
        yield http


async def post(http: httpx.AsyncClient, body: bytes, **headers: str) -> httpx.Response:
    """A signed POST; ``headers`` replace the signature's (any case)."""
    return await http.post("/payment", content=body, headers=signed(body) | lowered(headers))


async def outbox_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT message_id, routing_key, payload, status FROM rabbitretry.outbox ORDER BY id"
    )


async def test_a_callback_is_stored_in_the_outbox_before_the_200(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool, queue_name: str
) -> None:
    body = body_of()
    response = await post(receiver, body)
    assert response.status_code == 200, response.text
    assert response.json()["message"] == "stored"
    assert response.json()["message_id"] == "pay-t1-paid"
    # Committed before the answer: another connection sees it at once.
    rows = await outbox_rows(pool)
    assert [(r["message_id"], r["routing_key"], bytes(r["payload"])) for r in rows] == [
        ("pay-t1-paid", queue_name, body)
    ]


async def test_a_duplicate_answers_200_and_stores_nothing_new(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    first = await post(receiver, body_of())
    # The gateway's retry: signed again later, so headers differ, but the same business key.
    again = await post(receiver, body_of(), **SIGNATURE.headers(body_of(), time.time() + 1))
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json()["message"] == "duplicate"
    assert len(await outbox_rows(pool)) == 1
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.callback_receipt") == 1


async def test_concurrent_duplicates_store_one_row(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    body = body_of()
    responses = await asyncio.gather(*(post(receiver, body) for _ in range(20)))
    assert {r.status_code for r in responses} == {200}
    messages = sorted(r.json()["message"] for r in responses)
    assert messages == ["duplicate"] * 19 + ["stored"]
    assert len(await outbox_rows(pool)) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"x-signature": "0" * 64},
        {"x-signature-timestamp": "yesterday"},
        SIGNATURE.headers(body_of(), time.time() - 3600),  # a replay of an old request
        HmacSignature(secret="not-ours").headers(body_of(), time.time()),
    ],
)
async def test_a_bad_or_stale_signature_is_401_and_stores_nothing(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool, headers: dict[str, str]
) -> None:
    response = await post(receiver, body_of(), **headers)
    assert response.status_code == 401, response.text
    assert await outbox_rows(pool) == []
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger") == 0


async def test_an_unsigned_request_is_401(receiver: httpx.AsyncClient) -> None:
    response = await receiver.post("/payment", content=body_of())
    assert response.status_code == 401
    assert "missing X-Signature" in response.json()["message"]


async def test_a_tampered_body_is_401(receiver: httpx.AsyncClient) -> None:
    headers = signed(body_of(transaction="t1"))
    response = await receiver.post("/payment", content=body_of(transaction="t2"), headers=headers)
    assert response.status_code == 401


async def test_a_body_over_the_limit_is_413_unread(pool: asyncpg.Pool, queue_name: str) -> None:
    async with client_for(
        CallbackReceiver([kind_for(queue_name, max_body_bytes=100)], pool=pool)
    ) as http:
        big = body_of(transaction="t" * 200)
        assert (await post(http, big)).status_code == 413

        async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(10):
                yield b"x" * 50

        response = await http.post("/payment", content=streamed(), headers=signed(b""))
        assert response.status_code == 413
        assert (await post(http, body_of())).status_code == 200  # under the limit
    assert len(await outbox_rows(pool)) == 1


async def test_an_invalid_body_is_400_with_reasons_and_kept_as_a_dead_letter(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool, queue_name: str
) -> None:
    body = json.dumps({"transaction_id": "t1", "type": "teleported"}).encode()
    response = await post(receiver, body)
    assert response.status_code == 400
    reasons = response.json()["reasons"]
    assert any(r.startswith("order_id:") for r in reasons), reasons
    assert any(r.startswith("type:") for r in reasons), reasons
    again = await post(receiver, body)  # the gateway retries the same bad request
    assert again.status_code == 400
    rows = await pool.fetch(
        "SELECT message_id, status, reason, error_message, payload FROM rabbitretry.ledger"
        " WHERE queue = $1",
        queue_name,
    )
    assert len(rows) == 1  # one request, one dead letter, however often it is sent
    (row,) = rows
    assert row["message_id"].startswith("invalid-callback:payment:")
    assert (row["status"], row["reason"]) == ("dead", "invalid-callback")
    assert "order_id" in row["error_message"]
    assert bytes(row["payload"]) == body  # the raw request, byte for byte
    assert await outbox_rows(pool) == []


async def test_a_key_that_cannot_be_carried_is_400(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    response = await post(receiver, body_of(transaction="t" * 300))
    assert response.status_code == 400
    assert "longer than 255 bytes" in response.json()["reasons"][0]
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger") == 1


async def test_unknown_routes_are_404_and_other_methods_405(receiver: httpx.AsyncClient) -> None:
    assert (await post(receiver, body_of())).status_code == 200
    assert (await receiver.post("/refund", content=body_of())).status_code == 404
    assert (await receiver.post("/payment/extra", content=body_of())).status_code == 404
    assert (await receiver.get("/payment")).status_code == 405


async def test_mounted_in_an_app_it_opens_its_pool_on_the_first_request(
    database_url: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    receiver = CallbackReceiver([kind_for(queue_name)], database_url=database_url)
    app = Starlette(routes=[Mount("/callbacks", app=receiver)])  # its lifespan never runs
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            body = body_of()
            response = await http.post("/callbacks/payment", content=body, headers=signed(body))
            assert (await http.post("/payment", content=body)).status_code == 404
    finally:
        await receiver.close()
    assert response.status_code == 200, response.text
    assert [r["message_id"] for r in await outbox_rows(pool)] == ["pay-t1-paid"]


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_database_is_503(queue_name: str, database_url: str) -> None:
    parts = urlsplit(database_url)
    nowhere = parts._replace(netloc=f"{parts.username}@127.0.0.1:{closed_port()}").geturl()
    async with client_for(CallbackReceiver([kind_for(queue_name)], database_url=nowhere)) as http:
        response = await post(http, body_of())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"


async def test_database_outage_answers_503_and_the_gateways_retry_is_stored(
    database_url: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    parts = urlsplit(database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        receiver = CallbackReceiver(
            [kind_for(queue_name)], database_url=proxy.url_for(database_url)
        )
        async with client_for(receiver) as http:
            assert (await post(http, body_of("t1"))).status_code == 200
            await proxy.cut(refuse=True)
            down = [await post(http, body_of("t2")), await post(http, body_of("t3", "closed"))]
            assert [r.status_code for r in down] == [503, 503]
            assert [r["message_id"] for r in await outbox_rows(pool)] == ["pay-t1-paid"]
            proxy.restore()
            # The gateway sends again what was not acknowledged: nothing is lost.
            again = [await post(http, body_of("t2")), await post(http, body_of("t3", "closed"))]
            assert [r.status_code for r in again] == [200, 200]
            assert [r.json()["message"] for r in again] == ["stored", "stored"]
    finally:
        await proxy.close()
    keys = [r["message_id"] for r in await outbox_rows(pool)]
    assert keys == ["pay-t1-paid", "pay-t2-paid", "pay-t3-closed"]


async def test_the_relay_publishes_stored_callbacks_to_the_queue(
    receiver: httpx.AsyncClient,
    pool: asyncpg.Pool,
    queue_name: str,
    amqp_url: str,
    broker_cleanup: BrokerCleanup,
) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(broker_cleanup.queue(queue_name), durable=True)
        assert (await post(receiver, body_of())).status_code == 200
        async with running_relay(pool, amqp_url):

            async def published() -> aio_pika.abc.AbstractIncomingMessage | None:
                return await queue.get(fail=False)

            message = await wait_for(published, timeout=15)
        assert message.message_id == "pay-t1-paid"
        assert message.body == body_of()
        assert message.headers["rabbitretry-callback"] == "payment"
        await message.ack()
    finally:
        await connection.close()


async def test_out_of_order_callbacks_end_in_the_right_state_end_to_end(
    receiver: httpx.AsyncClient,
    pool: asyncpg.Pool,
    database_url: str,
    amqp_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute("CREATE TABLE cb_order (id text PRIMARY KEY, state text NOT NULL)")
    await pool.execute("INSERT INTO cb_order VALUES ('o1', 'pending')")

    class Settle(Consumer[Event]):
        queue = queue_name
        retry = RetryPolicy(max_attempts=10, initial_delay=0.5, max_delay=2.0)

        async def handle(self, msg: Event, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                change = await ORDER.move(conn, msg.order_id, msg.type, message_id=ctx.message_id)
            change.settle()

    cleanup.append(Settle)
    async with (
        running_worker([Settle], amqp_url, database_url, concurrency=2),
        running_relay(pool, amqp_url),
    ):
        # The refund's callback overtakes the payment's: it cannot apply yet, and waits.
        assert (await post(receiver, body_of("t1", "refunded"))).status_code == 200
        await wait_status(pool, queue_name, "pay-t1-refunded", "retrying")
        # The payment's comes, twice.
        for body in (body_of("t1", "paid"), body_of("t1", "paid")):
            assert (await post(receiver, body)).status_code == 200
        await wait_status(pool, queue_name, "pay-t1-refunded", "succeeded")
    assert await pool.fetchval("SELECT state FROM cb_order WHERE id = 'o1'") == "refunded"
    async with pool.acquire() as conn:
        history = await ORDER.history(conn, "o1")
    assert [(h["from_state"], h["to_state"], h["outcome"], h["message_id"]) for h in history] == [
        ("pending", "paid", "moved", "pay-t1-paid"),
        ("paid", "refunded", "moved", "pay-t1-refunded"),
    ]
    # The refund waited for the payment through the delay chain.
    attempts = await pool.fetchval(
        "SELECT attempts FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        queue_name,
        "pay-t1-refunded",
    )
    assert attempts >= 2
