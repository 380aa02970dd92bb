"""``rabbitretry callbacks serve`` in a subprocess: one-line refusals, then real requests."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

import asyncpg
import httpx
import pytest

from examples.payments import GATEWAY_SECRET, GatewayEvent
from rabbitretry.callbacks import HmacSignature
from tests.acceptance.cli_runner import CLI, ROOT
from tests.integration.harness import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


@pytest.mark.parametrize(
    ("target", "message", "code"),
    [
        ("nomodule:kinds", "cannot import module 'nomodule'", 2),
        ("examples.payments", "is not MODULE:NAME", 2),
        ("examples.payments:SettlePayment", "is not a CallbackKind", 2),
        ("examples.payments:payment_callbacks", "cannot connect to PostgreSQL", 1),
    ],
)
async def test_a_start_that_cannot_work_is_refused_in_one_line(
    target: str, message: str, code: int
) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [*CLI, "callbacks", "serve", target],
        # A closed port: only the last case gets as far as the database.
        env={**os.environ, "RABBITRETRY_DATABASE_URL": "postgresql://u@127.0.0.1:1/x"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


async def test_serve_stores_signed_callbacks_and_refuses_others(database_url: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "callbacks",
        "serve",
        "examples.payments:payment_callbacks",
        "--port",
        str(port),
        env={**os.environ, "RABBITRETRY_DATABASE_URL": database_url},
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    event = GatewayEvent(transaction_id="t1", order_id="o1", type="paid", amount=100)
    body = event.model_dump_json().encode()
    signed = HmacSignature(secret=GATEWAY_SECRET).headers(body, time.time())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def answering() -> httpx.Response | None:
                assert process.returncode is None, "the receiver exited"
                try:
                    return await client.post("/payment", content=body, headers=signed)
                except httpx.TransportError:
                    return None

            stored = await wait_for(answering, timeout=30)
            assert stored.status_code == 200 and stored.json()["message"] == "stored"
            again = await client.post("/payment", content=body, headers=signed)
            assert again.json()["message"] == "duplicate"
            assert (await client.post("/payment", content=body)).status_code == 401
            assert (await client.post("/refund", content=body)).status_code == 404
    finally:
        process.send_signal(signal.SIGTERM)
        _, output = await asyncio.wait_for(process.communicate(), timeout=30)
    # A graceful stop: uvicorn shuts down, then re-raises the signal it caught (as the console).
    assert process.returncode in (0, -signal.SIGTERM), output.decode()
    assert "POST http://127.0.0.1" in output.decode()
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT message_id, routing_key FROM rabbitretry.outbox")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [("payment-t1-paid", "payments.settle")]
