"""The downstream breakers' Prometheus metrics, read from the real ledger at scrape time through
a breaker's life: closed with a failure, open, probing, a failed probe, closed again; and on a
worker's /metrics endpoint."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from rabbitretry.monitoring import metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parsed(text: str) -> Samples:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def scrape(pool: asyncpg.Pool) -> Samples:
    return parsed((await metrics.render_ledger_metrics(pool)).decode())


def breaker(samples: Samples, name: str) -> dict[str, Any]:
    """What the metrics say of downstream ``name``."""

    def value(metric: str, **labels: str) -> float:
        return samples[(metric, tuple(sorted({"downstream": name, **labels}.items())))]

    return {
        "state": {
            state: value("rabbitretry_downstream_state", state=state)
            for state in ("closed", "open", "half-open")
        },
        "opened": value("rabbitretry_downstream_opened_total"),
        "failed_probes": value("rabbitretry_downstream_failed_probes"),
        "failures": value("rabbitretry_downstream_failures"),
    }


def only(state: str) -> dict[str, float]:
    return {each: 1.0 if each == state else 0.0 for each in ("closed", "open", "half-open")}


async def fail(pool: asyncpg.Pool, name: str, threshold: int) -> None:
    await pool.fetch(
        "SELECT * FROM rabbitretry.downstream_failed($1, 'w1', $2, 30, 1, 15, 'HTTP 500', 'q',"
        " 'm', 1)",
        name,
        threshold,
    )


async def probe(pool: asyncpg.Pool, name: str) -> None:
    await pool.execute(
        "UPDATE rabbitretry.downstream SET state = 'half-open', probe_worker = 'w1'"
        " WHERE name = $1",
        name,
    )


async def test_a_breaker_through_an_outage(pool: asyncpg.Pool) -> None:
    assert not [key for key in await scrape(pool) if key[0].startswith("rabbitretry_downstream")]

    await fail(pool, "wms", threshold=3)
    await fail(pool, "billing", threshold=3)
    await fail(pool, "billing", threshold=3)
    samples = await scrape(pool)
    assert breaker(samples, "wms") == {
        "state": only("closed"),
        "opened": 0.0,
        "failed_probes": 0.0,
        "failures": 1.0,
    }
    assert breaker(samples, "billing")["failures"] == 2.0

    await fail(pool, "billing", threshold=3)  # the third failure opens it
    samples = await scrape(pool)
    assert breaker(samples, "billing") == {
        "state": only("open"),
        "opened": 1.0,
        "failed_probes": 0.0,
        "failures": 3.0,
    }
    assert breaker(samples, "wms")["state"] == only("closed")  # one label set per downstream

    await probe(pool, "billing")
    assert breaker(await scrape(pool), "billing")["state"] == only("half-open")
    await fail(pool, "billing", threshold=3)  # the probe failed: open again
    await probe(pool, "billing")
    await fail(pool, "billing", threshold=3)
    samples = await scrape(pool)
    assert breaker(samples, "billing") == {
        "state": only("open"),
        "opened": 1.0,
        "failed_probes": 2.0,
        "failures": 3.0,
    }

    await probe(pool, "billing")
    assert await pool.fetchval("SELECT rabbitretry.downstream_succeeded('billing', 'w1')")
    await fail(pool, "billing", threshold=1)  # a second outage
    samples = await scrape(pool)
    assert breaker(samples, "billing") == {
        "state": only("open"),
        "opened": 2.0,
        "failed_probes": 0.0,
        "failures": 1.0,
    }
    await probe(pool, "billing")
    await pool.fetchval("SELECT rabbitretry.downstream_succeeded('billing', 'w1')")
    samples = await scrape(pool)
    assert breaker(samples, "billing") == {
        "state": only("closed"),
        "opened": 2.0,
        "failed_probes": 0.0,
        "failures": 0.0,
    }
    assert samples[("rabbitretry_ledger_up", ())] == 1.0


async def test_the_types_and_help_follow_the_other_metrics(pool: asyncpg.Pool) -> None:
    await fail(pool, "wms", threshold=1)
    text = (await metrics.render_ledger_metrics(pool)).decode()
    assert "# TYPE rabbitretry_downstream_state gauge" in text
    assert "# TYPE rabbitretry_downstream_opened_total counter" in text
    assert "# TYPE rabbitretry_downstream_failed_probes gauge" in text
    assert "# TYPE rabbitretry_downstream_failures gauge" in text
    assert 'rabbitretry_downstream_state{downstream="wms",state="open"} 1.0' in text
    assert 'rabbitretry_downstream_state{downstream="wms",state="half-open"} 0.0' in text
    assert 'rabbitretry_downstream_opened_total{downstream="wms"} 1.0' in text
    assert "rabbitretry_downstream_opened_created" not in text


async def test_a_worker_endpoint_serves_them(pool: asyncpg.Pool) -> None:
    await fail(pool, "wms", threshold=1)
    async with metrics.serving(metrics.WorkerMetrics(pool), pool, port=0) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        raw = (await reader.read()).decode()
        writer.close()
    _, _, body = raw.partition("\r\n\r\n")
    assert breaker(parsed(body), "wms")["state"] == only("open")
