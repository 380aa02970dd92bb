"""Operator actions on real dead letters: list, group, replay (canary, cutoff), ignore, edit."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from rabbitretry import Consumer, Context, RetryPolicy, operations
from rabbitretry.ledger import Key
from rabbitretry.operations import Filter, OperationError
from tests.integration.dead_harness import Order, Switch, dead_letters, orders_consumer
from tests.integration.harness import publish, running_worker, wait_status

pytestmark = pytest.mark.asyncio
ACTOR = "test:operator"


async def audit_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM rabbitretry.audit ORDER BY id")


async def test_list_filter_and_group(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {
        "o-1": {"order": 1},
        "o-2": {"order": 2},
        "neg": {"order": -5},
        "junk": b"not json",
    }
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        dead = await operations.list_messages(pool, Filter(queue=queue_name))
        assert {r["message_id"] for r in dead} == set(bodies)
        found = await operations.list_messages(pool, Filter(text="NOT FOUND"))
        assert {r["message_id"] for r in found} == {"o-1", "o-2", "neg"}
        assert [r["message_id"] for r in await operations.list_messages(pool, Filter(text="o-2"))]
        invalid = await operations.list_messages(pool, Filter(error="invalid-payload"))
        assert [r["message_id"] for r in invalid] == ["junk"]
        assert not await operations.list_messages(pool, Filter(statuses=("retrying",)))

        groups = await operations.groups(pool, Filter(queue=queue_name))
        counts = {g["error_type"]: g["messages"] for g in groups}
        assert sorted(g["messages"] for g in groups) == [1, 1, 2]
        assert counts["invalid-payload"] == 1
        biggest = groups[0]
        assert biggest["messages"] == 2 and biggest["first_seen"] <= biggest["last_seen"]
        members = await operations.list_messages(pool, Filter(fingerprint=biggest["fingerprint"]))
        assert {r["message_id"] for r in members} == {"o-1", "o-2"}


async def test_group_replay_with_canary_and_cutoff(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    async with dead_letters(
        consumer, amqp_url, database_url, pool, {f"o-{n}": {"order": n} for n in range(3)}
    ):
        (group,) = await operations.groups(pool, Filter(queue=queue_name))
        # Still broken: the canary dies again and nothing else is replayed.
        targets = await operations.replay_targets(pool, fingerprint=group["fingerprint"])
        assert [k.message_id for k in targets] == ["o-0", "o-1", "o-2"]
        async with operations.sender(amqp_url) as sender:
            report = await operations.replay(
                pool, sender, targets, actor=ACTOR, rate=50, canary=True, canary_timeout=30
            )
        assert report.replayed == 1 and report.stopped and "dead" in report.stopped
        assert len(await operations.list_messages(pool, Filter(queue=queue_name))) == 3

        cutoff: datetime = await pool.fetchval("SELECT now()")
        async with dead_letters(consumer, amqp_url, database_url, pool, {"late": {"order": 9}}):
            pass
        Broken.broken = False
        targets = await operations.replay_targets(
            pool, fingerprint=group["fingerprint"], before=cutoff
        )
        async with operations.sender(amqp_url) as sender:
            report = await operations.replay(
                pool, sender, targets, actor=ACTOR, rate=50, canary=True, canary_timeout=30
            )
        assert report.replayed == 3 and report.stopped is None
        assert report.canary == f"{queue_name}/o-1 succeeded"
        for n in range(3):
            await wait_status(pool, queue_name, f"o-{n}", "succeeded")
        # The cutoff left the later failure of the same group alone.
        assert [r["message_id"] for r in await operations.list_messages(pool, Filter())] == ["late"]

    rows = await audit_rows(pool)
    assert [r["action"] for r in rows].count("replay") == 4
    batches = [r for r in rows if r["action"] == "replay-batch"]
    assert [b["messages"] for b in batches] == [1, 3]
    assert all(r["actor"] == ACTOR for r in rows)
    assert json.loads(batches[1]["detail"])["canary"] == f"{queue_name}/o-1 succeeded"


async def test_ignore_and_edit_then_replay(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Broken(Switch):
        broken = False

    consumer = orders_consumer(queue_name, Broken)
    consumer.keep_payload = "always"  # the replayed payload is read from the row
    cleanup.append(consumer)
    bodies: dict[str, Any] = {"neg": {"order": -1}, "skip": {"order": -2}}
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        with pytest.raises(OperationError, match="comment"):
            await operations.ignore(pool, Key(queue_name, "skip"), actor=ACTOR, comment=" ")
        assert await operations.ignore(
            pool, Key(queue_name, "skip"), actor=ACTOR, comment="customer cancelled"
        )
        assert not await operations.ignore(
            pool, Key(queue_name, "skip"), actor=ACTOR, comment="again"
        )
        await wait_status(pool, queue_name, "skip", "ignored", timeout=1)

        async with operations.sender(amqp_url) as sender:
            with pytest.raises(OperationError, match="order"):
                await operations.edit_and_replay(
                    pool,
                    sender,
                    Key(queue_name, "neg"),
                    '{"order": "many"}',
                    actor=ACTOR,
                    payload_adapter=consumer.payload_adapter,
                )
            with pytest.raises(OperationError, match="JSON"):
                await operations.edit_and_replay(
                    pool, sender, Key(queue_name, "neg"), "{oops", actor=ACTOR
                )
            assert await operations.edit_and_replay(
                pool,
                sender,
                Key(queue_name, "neg"),
                '{"order": 7, "note": "fixed"}',
                actor=ACTOR,
                payload_adapter=consumer.payload_adapter,
                comment="sign typo",
            )
        await wait_status(pool, queue_name, "neg", "succeeded")
        payload = await pool.fetchval(
            "SELECT payload FROM rabbitretry.ledger WHERE queue = $1 AND message_id = 'neg'",
            queue_name,
        )
        assert json.loads(payload) == {"order": 7, "note": "fixed"}

    rows = await audit_rows(pool)
    assert [(r["action"], r["message_id"], r["comment"]) for r in rows] == [
        ("ignore", "skip", "customer cancelled"),
        ("edit-replay", "neg", "sign typo"),
    ]
    assert json.loads(rows[1]["detail"])["previous_payload"] == '{"order": -1}'


async def test_export_jsonl(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {"o-1": {"order": 1}, "junk": b"\xff\x00binary"}
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        lines: list[str] = []
        count = await operations.export(pool, Filter(queue=queue_name), lines.append, actor=ACTOR)
    assert count == 2
    exported = {e["message_id"]: e for e in map(json.loads, lines)}
    assert exported["o-1"]["payload"] == {"order": 1}
    assert exported["o-1"]["error_message"] == "order 1 not found"
    assert exported["junk"]["payload_base64"] == "/wBiaW5hcnk="
    (row,) = await audit_rows(pool)
    assert (row["action"], row["messages"], row["queue"]) == ("export", 2, queue_name)


async def test_retrying_messages_are_listed_and_can_be_ignored(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Flaky(Consumer[Order]):
        queue = queue_name
        retry = RetryPolicy(max_attempts=5, initial_delay=8.0, max_delay=8.0, jitter=0.0)

        async def handle(self, msg: Order, ctx: Context) -> None:
            raise ConnectionError(f"payment service down for order {msg.order}")

    cleanup.append(Flaky)
    async with running_worker([Flaky], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"order": 5}, message_id="r-1")
        await wait_status(pool, queue_name, "r-1", "retrying")
        (row,) = await operations.list_messages(pool, Filter(statuses=("retrying",)))
        assert (row["message_id"], row["error_type"]) == ("r-1", "ConnectionError")
        assert row["next_retry_at"] is not None
        assert not await operations.replay_targets(pool, queue=queue_name)  # not dead
        assert await operations.ignore(
            pool, Key(queue_name, "r-1"), actor=ACTOR, comment="order refunded by hand"
        )
    row = await pool.fetchrow(
        "SELECT status, attempts, next_retry_at FROM rabbitretry.ledger WHERE message_id = 'r-1'"
    )
    assert (row["status"], row["attempts"], row["next_retry_at"]) == ("ignored", 1, None)
    (entry,) = await audit_rows(pool)
    assert json.loads(entry["detail"]) == {"status_before": "retrying"}
