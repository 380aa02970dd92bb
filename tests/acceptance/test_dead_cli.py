"""``rabbitretry dead ...`` in subprocesses: what an operator types, sees and gets back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from rabbitretry import Consumer, amqp
from tests.acceptance.cli_runner import (  # noqa: F401 (fixtures, requested by name)
    Run,
    broker_cleanup_fixture,
    cleanup_fixture,
    rabbitretry_fixture,
)
from tests.integration.dead_harness import Switch, dead_letters, orders_consumer
from tests.integration.harness import running_worker, status_of, wait_status

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr
    return lines[0]


async def audit_actions(pool: asyncpg.Pool) -> list[tuple[str, str | None, int]]:
    rows = await pool.fetch(
        "SELECT action, message_id, messages FROM rabbitretry.audit ORDER BY id"
    )
    return [(r["action"], r["message_id"], r["messages"]) for r in rows]


async def test_list_group_show_and_export(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
    tmp_path: Path,
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {"o-1": {"order": 1}, "o-2": {"order": 2}, "junk": b"<not json>"}
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        pass

    listed = await rabbitretry("dead", "list", "--queue", queue_name)
    assert listed.returncode == 0, listed.stderr
    assert "3 dead message(s)" in listed.stdout
    assert "order 2 not found" in listed.stdout and "invalid-payload" in listed.stdout

    searched = await rabbitretry("dead", "list", "--search", "ORDER 1")
    assert "o-1" in searched.stdout and "o-2" not in searched.stdout

    grouped = await rabbitretry("dead", "list", "--group")
    assert grouped.returncode == 0, grouped.stderr
    assert "2 group(s) of dead messages" in grouped.stdout
    fingerprint = await pool.fetchval(
        "SELECT error_fingerprint FROM rabbitretry.ledger WHERE message_id = 'o-1'"
    )
    (group_line,) = [line for line in grouped.stdout.splitlines() if fingerprint in line]
    assert " 2 " in group_line and "Permanent" in group_line

    shown = await rabbitretry("dead", "show", "o-1")
    assert shown.returncode == 0 and '"order": 1' in shown.stdout
    assert "Permanent: order 1 not found" in shown.stdout

    target = tmp_path / "dead.jsonl"
    exported = await rabbitretry("dead", "export", "--format", "jsonl", "-o", str(target))
    assert exported.returncode == 0 and "exported 3 message(s)" in exported.stdout
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert {line["message_id"] for line in lines} == set(bodies)
    to_stdout = await rabbitretry("dead", "export", "--fingerprint", fingerprint)
    assert [json.loads(line)["payload"]["order"] for line in to_stdout.stdout.splitlines()] == [
        1,
        2,
    ]
    assert await audit_actions(pool) == [("export", None, 3), ("export", None, 2)]


async def test_group_replay_with_canary_rate_and_cutoff(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {f"o-{n}": {"order": n} for n in range(3)}
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        fingerprint = await pool.fetchval(
            "SELECT error_fingerprint FROM rabbitretry.ledger WHERE message_id = 'o-0'"
        )
        failed = await rabbitretry(
            "dead", "replay", "--group", fingerprint, "--canary", "--canary-timeout", "30"
        )
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "stopped: the canary" in failed.stdout and "2 left dead" in failed.stdout

    cutoff = (await pool.fetchval("SELECT now()")).isoformat()
    async with dead_letters(consumer, amqp_url, database_url, pool, {"late": {"order": 9}}):
        pass
    Broken.broken = False
    async with running_worker([consumer], amqp_url, database_url):
        dry = await rabbitretry(
            "dead", "replay", "--group", fingerprint, "--before", cutoff, "--dry-run"
        )
        assert "dry run: 3 dead letter(s) would be replayed" in dry.stdout
        assert "late" not in dry.stdout
        done = await rabbitretry(
            "dead", "replay", "--group", fingerprint, "--rate", "20/s", "--canary",
            "--before", cutoff,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"replayed 3 of 3; canary {queue_name}/o-1 succeeded" in done.stdout
        for n in range(3):
            await wait_status(pool, queue_name, f"o-{n}", "succeeded")
    assert await status_of(pool, queue_name, "late") == "dead"
    assert [a for a in await audit_actions(pool) if a[0] == "replay-batch"] == [
        ("replay-batch", None, 1),
        ("replay-batch", None, 3),
    ]


async def test_ignore_and_edit(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
) -> None:
    class Mended(Switch):
        broken = False

    consumer = orders_consumer(queue_name, Mended)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {"a": {"order": -1}, "b": {"order": -2}}
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        ignored = await rabbitretry("dead", "ignore", "a", "--comment", "duplicate order")
        assert ignored.returncode == 0 and f"ignored {queue_name}/a" in ignored.stdout
        assert await status_of(pool, queue_name, "a") == "ignored"
        again = await rabbitretry("dead", "ignore", "a", "--comment", "again")
        assert again.returncode == 2
        assert "is ignored: only dead or retrying" in one_error_line(again.stderr)

        model = "tests.acceptance.models:Orders"
        wrong = await rabbitretry(
            "dead", "edit", "b", "--payload", '{"order": "x"}', "--consumer", model
        )
        assert wrong.returncode == 2
        assert "does not fit the consumer's model: order" in one_error_line(wrong.stderr)
        assert await status_of(pool, queue_name, "b") == "dead"
        fixed = await rabbitretry(
            "dead", "edit", "b", "--payload", '{"order": 2}', "--consumer", model, "-m", "sign"
        )
        assert fixed.returncode == 0, fixed.stderr
        await wait_status(pool, queue_name, "b", "succeeded")

    shown = await rabbitretry("dead", "show", "a")
    assert "ignore: duplicate order" in shown.stdout
    assert await audit_actions(pool) == [("ignore", "a", 1), ("edit-replay", "b", 1)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dead", "replay"], "say what to replay"),
        (["dead", "replay", "k", "--all"], "not both"),
        (["dead", "replay", "--all", "--rate", "fast"], "not a rate like 20/s"),
        (["dead", "replay", "--all", "--before", "yesterday"], "neither a duration"),
        (["dead", "replay", "nokey"], "no message with key 'nokey'"),
        (["dead", "list", "--status", "succeeded"], "status must be one of"),
        (["dead", "ignore", "nokey", "--comment", "x"], "no message with key"),
        (["dead", "edit", "k"], "give the new payload"),
        (["dead", "edit", "k", "--payload", "{"], "not valid JSON"),
        (["dead", "export", "--format", "csv"], "only jsonl"),
    ],
)
async def test_mistakes_are_one_line_and_exit_2(
    rabbitretry: Run, args: list[str], message: str
) -> None:
    done = await rabbitretry(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in one_error_line(done.stderr)


async def test_unreachable_database_is_one_line_and_exit_1(rabbitretry: Run) -> None:
    done = await rabbitretry(
        "dead", "list", database="postgresql://postgres:s3cret@127.0.0.1:1/nowhere"
    )
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert "cannot connect to PostgreSQL" in line and "s3cret" not in line


async def test_text_from_a_producer_is_shown_as_written(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
) -> None:
    """A key is the producer's text: rich markup in it is not markup (a closing tag that
    matches none made `dead list` fail with a traceback), and a terminal escape sequence is
    spelled out rather than sent to the operator's terminal."""

    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    hostile = "[/oops][bold]k[/bold]\x1b[31m"
    async with dead_letters(consumer, amqp_url, database_url, pool, {hostile: {"order": 1}}):
        pass

    listed = await rabbitretry("dead", "list", "--queue", queue_name)
    assert listed.returncode == 0, listed.stderr
    assert "[/oops][bold]k[/bold][U+001B][31m" in listed.stdout
    assert "\x1b" not in listed.stdout


async def test_a_replay_the_broker_refuses_is_listed_left_dead_and_exits_1(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
) -> None:
    """One queue's work queue was deleted: its dead letters come back unroutable. The others
    are replayed; the refused one is listed with the broker's reason, and stays dead."""

    class Broken(Switch):
        broken = True

    kept = orders_consumer(queue_name, Broken)
    gone = orders_consumer(f"{queue_name}.gone", Broken)
    cleanup += [kept, gone]
    async with dead_letters(gone, amqp_url, database_url, pool, {"g-1": {"order": 1}}):
        pass
    async with dead_letters(kept, amqp_url, database_url, pool, {"k-1": {"order": 2}}):
        pass
    connection = await amqp.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(gone.queue)
    finally:
        await connection.close()

    done = await rabbitretry("dead", "replay", "--all")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "replayed 1 of 2, 1 refused by the broker (left dead)" in done.stdout
    assert (
        f"refused: {gone.queue}/g-1: no queue is bound for exchange '(default)' with routing "
        f"key '{gone.queue}'" in done.stdout
    )
    assert "Traceback" not in done.stderr
    assert await status_of(pool, gone.queue, "g-1") == "dead"
    assert await status_of(pool, queue_name, "k-1") == "retrying"
