"""``rabbitretry downstream list|open|close`` in a subprocess, against a fresh ledger database
and the real broker: the listing (with the messages waiting on each queue), the operator's
hold and close of a breaker, their audit rows, and the one-line refusals."""

from __future__ import annotations

import json

import asyncpg
import pytest

from rabbitretry import Downstream, amqp
from rabbitretry.ledger import Key, downstreams
from tests.acceptance.cli import env_for, rabbitretry
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish

pytestmark = pytest.mark.asyncio

UNREACHABLE_BROKER = "amqp://guest:guest@127.0.0.1:1/"


async def breaker(pool: asyncpg.Pool, name: str = "wms") -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM rabbitretry.downstream WHERE name = $1", name)
    assert row is not None
    return row


async def audit_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM rabbitretry.audit ORDER BY id")


async def trip(pool: asyncpg.Pool, queue: str, error: str = "HTTP 500 from the WMS") -> None:
    """Fail ``wms`` until its breaker opens, as workers would."""
    wms = Downstream("wms", failure_threshold=2)
    for attempt in (1, 2):
        failed = await downstreams.failed(pool, wms, "worker-1", error, Key(queue, "m-1"), attempt)
    assert failed.opened


async def test_list_says_how_to_declare_one_when_there_is_none(
    amqp_url: str, database_url: str
) -> None:
    env = env_for(amqp_url, database_url)
    listed = await rabbitretry(env, "downstream", "list")
    assert listed.code == 0, listed.stderr
    assert "no downstream has been recorded yet" in listed.stdout
    assert "Downstream(" in listed.stdout and listed.stderr == ""
    as_json = await rabbitretry(env, "downstream", "list", "--json")
    assert as_json.code == 0 and json.loads(as_json.stdout) == []


async def test_list_shows_a_tripped_breaker_and_the_messages_waiting_on_its_queue(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    amqp_connection: amqp.Connection,
    broker_cleanup: BrokerCleanup,
) -> None:
    channel = await amqp_connection.channel()
    await channel.declare_queue(broker_cleanup.queue(queue_name), durable=True)
    await channel.close()
    await publish(amqp_url, queue_name, {"order_id": 1}, message_id=None, times=3)
    await downstreams.declare(pool, ["wms", "billing"], queue_name)
    await downstreams.declare(pool, ["billing"], "rr-no-such-queue")
    await trip(pool, queue_name, "HTTP 500 " + "x" * 200)
    env = env_for(amqp_url, database_url)

    listed = await rabbitretry(env, "downstream", "list")
    assert listed.code == 0, listed.stderr
    assert listed.stderr == ""
    lines = listed.stdout.splitlines()
    (wms,) = [line for line in lines if " wms " in line]
    assert " open " in wms and f"{queue_name}: 3" in wms and "HTTP 500 xxx" in wms
    assert "x" * 100 not in wms and "…" in wms  # the last error is shortened
    (billing,) = [line for line in lines if " billing " in line]
    assert " closed " in billing and "rr-no-such-queue: no such queue" in billing

    as_json = await rabbitretry(env, "downstream", "list", "--json")
    assert as_json.code == 0, as_json.stderr
    by_name = {entry["name"]: entry for entry in json.loads(as_json.stdout)}
    assert by_name["wms"]["state"] == "open" and by_name["wms"]["failures"] == 2
    assert by_name["wms"]["waiting"] == {queue_name: 3}
    assert by_name["billing"]["waiting"] == {queue_name: 3, "rr-no-such-queue": None}


async def test_list_without_the_broker_shows_unknown_counts_and_one_warning(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await downstreams.declare(pool, ["wms"], queue_name)
    listed = await rabbitretry(env_for(UNREACHABLE_BROKER, database_url), "downstream", "list")
    assert listed.code == 0, listed.stderr
    assert f"{queue_name}: ?" in listed.stdout
    (warning,) = listed.stderr.splitlines()
    assert warning.startswith("warning: messages waiting unknown")
    assert "Traceback" not in listed.stderr


async def test_open_holds_the_breaker_and_close_releases_it_both_audited(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await downstreams.declare(pool, ["wms"], queue_name)
    env = env_for(amqp_url, database_url)

    opened = await rabbitretry(env, "downstream", "open", "wms", "--reason", "WMS maintenance")
    assert opened.code == 0, opened.stderr
    assert "held downstream wms open" in opened.stdout and queue_name in opened.stdout
    assert "rabbitretry downstream close wms" in opened.stdout
    row = await breaker(pool)
    assert (row["state"], row["forced"]) == ("open", "open")
    assert row["forced_by"].startswith("cli:") and row["next_probe_at"] is None
    listed = await rabbitretry(env, "downstream", "list")
    assert "open (held)" in listed.stdout and "none until closed" in listed.stdout
    assert row["forced_by"] in listed.stdout

    # A failure met while it is held open (a call already under way) does not count.
    wms = Downstream("wms", failure_threshold=1)
    failed = await downstreams.failed(pool, wms, "worker-1", "late", Key(queue_name, "m-1"), 1)
    assert (failed.state, failed.opened) == ("open", False)
    closed = await rabbitretry(env, "downstream", "close", "wms")
    assert closed.code == 0, closed.stderr
    assert "closed downstream wms" in closed.stdout and "held open by cli:" in closed.stdout
    row = await breaker(pool)
    assert (row["state"], row["forced"], row["failures"]) == ("closed", None, 0)

    opening, closing = await audit_rows(pool)
    assert (opening["action"], closing["action"]) == ("downstream-open", "downstream-close")
    assert opening["actor"] == closing["actor"] == row["forced_by"]
    assert opening["comment"] == "WMS maintenance" and closing["comment"] is None
    assert opening["queue"] == queue_name and opening["messages"] == 0
    detail = json.loads(opening["detail"])
    assert detail["downstream"] == "wms" and detail["state_before"] == "closed"
    assert detail["state"] == "open" and detail["queues"] == [queue_name]
    assert json.loads(closing["detail"])["held_open_before"] is True


async def test_close_of_a_tripped_breaker_resets_its_failures(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await trip(pool, queue_name)
    closed = await rabbitretry(
        env_for(amqp_url, database_url), "downstream", "close", "wms", "-m", "WMS is back"
    )
    assert closed.code == 0, closed.stderr
    assert "it was open since" in closed.stdout
    row = await breaker(pool)
    assert (row["state"], row["failures"], row["next_probe_at"]) == ("closed", 0, None)
    (entry,) = await audit_rows(pool)
    assert entry["comment"] == "WMS is back" and json.loads(entry["detail"])["failures_before"] == 2


async def test_an_unknown_downstream_is_one_line_naming_the_known_ones(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    env = env_for(amqp_url, database_url)
    none_yet = await rabbitretry(env, "downstream", "close", "wms")
    assert none_yet.code == 2
    assert none_yet.stderr.strip() == (
        "error: no downstream named 'wms': none has been recorded yet (a worker records the "
        "downstreams its consumers declare when it starts)"
    )
    await downstreams.declare(pool, ["wms", "billing"], queue_name)
    for action in ("close", "open"):
        refused = await rabbitretry(env, "downstream", action, "wsm")
        assert refused.code == 2, refused.stdout
        assert refused.stderr.strip() == (
            "error: no downstream named 'wsm': known downstreams are billing, wms"
        )
        assert refused.stdout == ""
    assert await audit_rows(pool) == []
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.downstream") == 2


async def test_help_teaches_the_group_and_each_command(amqp_url: str, database_url: str) -> None:
    env = env_for(amqp_url, database_url)
    group = await rabbitretry(env, "downstream", "--help")
    assert group.code == 0 and "circuit breaker" in group.stdout
    assert "rabbitretry downstream open wms" in group.stdout
    for action, phrase in (
        ("list", "--json"),
        ("open", "--reason"),
        ("close", "rabbitretry downstream close wms"),
    ):
        shown = await rabbitretry(env, "downstream", action, "--help")
        assert shown.code == 0, shown.stderr
        assert phrase in shown.stdout and "--database" in shown.stdout
