"""A worker whose consumers keep their ledgers in two databases: ``/healthz`` has a check per
database (its outage gate and its answer), and the ledger gauges a ``database`` label."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from rabbitretry import Consumer, Context, Permanent, db
from rabbitretry.monitoring import metrics
from tests.integration.harness import publish, running_worker, wait_for, wait_status
from tests.integration.test_health import answers, healthz
from tests.integration.test_metrics import scrape, value
from tests.integration.test_pipeline import Job, make_consumer
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio


async def _refuse_odd(msg: Job, ctx: Context) -> None:
    if msg.n % 2:
        raise Permanent("odd")


async def test_healthz_and_gauges_cover_every_ledger_database(
    amqp_url: str,
    database_url: str,
    second_database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    parts = urlsplit(second_database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    away_url = proxy.url_for(second_database_url)
    home = make_consumer(f"{queue_name}-home", _refuse_odd)
    away = make_consumer(f"{queue_name}-away", _refuse_odd, database_url=away_url)
    cleanup += [home, away]
    second = await db.create_pool(away_url, min_size=1, max_size=2)
    try:
        async with running_worker([home, away], amqp_url, database_url) as worker:
            labels = worker.ledger_databases
            first_label, second_label = labels[None], labels[away_url]
            assert first_label != second_label
            assert "postgres@" not in first_label + second_label  # names, not URLs
            await publish(amqp_url, away.queue, {"n": 1}, message_id="a1")
            await publish(amqp_url, home.queue, {"n": 2}, message_id="h2")
            await wait_status(second, away.queue, "a1", "dead")
            await wait_status(pool, home.queue, "h2", "succeeded")

            pools = {first_label: pool, second_label: second}
            observed = metrics.WorkerMetrics(pool)
            async with metrics.serving(observed, pools, port=0, health=worker.health) as port:
                status, document = await healthz(port)
                assert (status, document["checks"]) == (
                    200,
                    {
                        "broker": "ok",
                        f"ledger:{first_label}": "ok",
                        f"ledger:{second_label}": "ok",
                        "consumers": "ok",
                        f"database:{first_label}": "ok",
                        f"database:{second_label}": "ok",
                    },
                )
                samples = await scrape(port)
                ledger = "rabbitretry_ledger_messages"
                dead = {"status": "dead"}
                assert value(samples, ledger, database=second_label, queue=away.queue, **dead) == 1
                assert value(samples, ledger, database=first_label, queue=home.queue, **dead) == 0
                assert ("rabbitretry_ledger_messages", ()) not in samples
                for label in (first_label, second_label):
                    assert value(samples, "rabbitretry_ledger_up", database=label) == 1

                await proxy.cut(refuse=True)
                # A delivery for the second database meets the outage and closes its gate.
                await publish(amqp_url, away.queue, {"n": 2}, message_id="a2")
                checks = {
                    f"ledger:{second_label}": "the ledger at",
                    f"database:{second_label}": "the database",
                }
                down = await wait_for(answers(port, 503, **checks), timeout=30)
                assert down["checks"][f"ledger:{first_label}"] == "ok"
                assert down["checks"][f"database:{first_label}"] == "ok"
                assert "postgres@127.0.0.1:" in down["checks"][f"ledger:{second_label}"]
                samples = await scrape(port)
                assert value(samples, "rabbitretry_ledger_up", database=first_label) == 1
                assert value(samples, "rabbitretry_ledger_up", database=second_label) == 0

                proxy.restore()
                await wait_for(answers(port, 200), timeout=30)
                await wait_status(second, away.queue, "a2", "succeeded")
    finally:
        await second.close()
        await proxy.close()


async def test_one_database_keeps_its_checks_and_gauges_unlabelled(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = make_consumer(queue_name, _refuse_odd)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url) as worker:
        assert set(worker.health().checks) == {"broker", "ledger", "consumers"}
        async with metrics.serving(metrics.WorkerMetrics(pool), pool, port=0) as port:
            samples = await scrape(port)
    assert value(samples, "rabbitretry_ledger_up") == 1
    assert not any(dict(labels).get("database") for _, labels in samples)
