"""Output for scripts and the help a person reads: --json, tables when piped, consistent options.

Every --json is plain JSON on stdout (no markup, no colour) that a script can parse as it is;
a table piped to a file keeps each key on one line; and the help of every command agrees on
what a short option, a rate and -v mean.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from tests.acceptance.cli import CLI, ROOT
from tests.acceptance.cli_runner import broker_cleanup_fixture  # noqa: F401 (fixture)
from tests.integration.conftest import BrokerCleanup

pytestmark = pytest.mark.slow


def piped(
    amqp_url: str, database_url: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The CLI with stdout a pipe and no COLUMNS: how a script or `| grep` sees it."""
    environment = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        **env,
    }
    environment.pop("COLUMNS", None)
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        environment.pop(name, None)
    return subprocess.run(
        [*CLI, *args], env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def json_of(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout  # no terminal codes
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one document, on one line
    return json.loads(lines[0])


LONG_KEY = "order-" + "x" * 150 + "-paid"


async def add_dead_letters(pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " payload, error_type, error_message, error_fingerprint, finished_at)"
        " VALUES ('orders', $1, 'dead', 3, 3, '{}', 'KeyError', 'order 7 not found', 'fp1',"
        "  now()),"
        " ('orders', 'o-2', 'dead', 3, 3, '{}', 'KeyError', 'order 8 not found', 'fp1', now()),"
        " ('orders', 'o-3', 'succeeded', 1, 3, '{}', NULL, NULL, NULL, now())",
        LONG_KEY,
    )


async def test_dead_list_json(amqp_url: str, database_url: str, pool: asyncpg.Pool) -> None:
    assert json_of(piped(amqp_url, database_url, "dead", "list", "--json")) == []
    await add_dead_letters(pool)

    messages = json_of(piped(amqp_url, database_url, "dead", "list", "--json"))
    assert sorted(m["message_id"] for m in messages) == sorted([LONG_KEY, "o-2"])
    first = next(m for m in messages if m["message_id"] == "o-2")
    assert first["queue"] == "orders" and first["status"] == "dead"
    assert first["attempts"] == 3 and first["error_type"] == "KeyError"
    assert first["error_message"] == "order 8 not found"
    assert first["error_fingerprint"] == "fp1"
    assert "T" in first["changed_at"]  # ISO 8601

    groups = json_of(piped(amqp_url, database_url, "dead", "list", "--group", "--json"))
    assert [(g["fingerprint"], g["queue"], g["messages"]) for g in groups] == [("fp1", "orders", 2)]


async def test_tables_keep_keys_whole_when_piped(
    amqp_url: str, database_url: str, pool: asyncpg.Pool
) -> None:
    await add_dead_letters(pool)
    done = piped(amqp_url, database_url, "dead", "list")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    row = [line for line in done.stdout.splitlines() if LONG_KEY in line]
    assert len(row) == 1, done.stdout
    assert "order 7 not found" in row[0] and "KeyError" in row[0]


async def test_ledger_stats_json(amqp_url: str, database_url: str, pool: asyncpg.Pool) -> None:
    assert json_of(piped(amqp_url, database_url, "ledger", "stats", "--json")) == []
    await add_dead_letters(pool)
    stats = json_of(piped(amqp_url, database_url, "ledger", "stats", "--json"))
    assert [(s["queue"], s["status"], s["messages"], s["attempts"]) for s in stats] == [
        ("orders", "dead", 2, 6),
        ("orders", "succeeded", 1, 1),
    ]
    assert all("T" in s["oldest"] for s in stats)


async def test_alerts_list_json(amqp_url: str, database_url: str, pool: asyncpg.Pool) -> None:
    assert json_of(piped(amqp_url, database_url, "alerts", "list", "--json")) == []
    await pool.execute(
        "INSERT INTO rabbitretry.alert (kind, group_key, queue, error_type, error_message,"
        " count, sample_keys) VALUES ('dead', 'fp1', 'orders', 'KeyError', 'order 7 not found',"
        " 2, '{o-1,o-2}')"
    )
    [alert] = json_of(piped(amqp_url, database_url, "alerts", "list", "--json"))
    assert alert["kind"] == "dead" and alert["status"] == "pending"
    assert alert["count"] == 2 and alert["sample_keys"] == ["o-1", "o-2"]
    assert alert["title"] == "2 messages dead on orders: KeyError"
    assert alert["sent_at"] is None and "T" in alert["first_seen"]


async def declared_queue(amqp_url: str, name: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True)
    finally:
        await connection.close()


async def test_reconcile_json_names_the_missing_keys(
    amqp_url: str, database_url: str, queue_name: str, broker_cleanup: BrokerCleanup
) -> None:
    await declared_queue(amqp_url, broker_cleanup.queue(queue_name))
    done = piped(
        amqp_url,
        database_url,
        "reconcile",
        "--once",
        "--json",
        "tests.acceptance.expected:two_orders",
        RR_EXPECTED_QUEUE=queue_name,
    )
    report = json_of(done)
    assert report["errors"] == [] and report["retries_redriven"] == 0
    [window] = report["windows"]
    assert window["reconciliation"] == "two_orders" and window["queue"] == queue_name
    assert window["expected"] == 2 and window["missing"] == 2
    assert window["missing_keys"] == ["order-1-paid", "order-2-paid"]
    assert window["republished"] == 2 and window["orphan_examples"] == []


async def test_reconcile_json_prints_one_line_per_pass(amqp_url: str, database_url: str) -> None:
    environment = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
    }
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "reconcile",
        "--interval",
        "1",
        "--json",
        cwd=ROOT,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(30):
            first = json.loads(await process.stdout.readline())
            second = json.loads(await process.stdout.readline())
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    for report in (first, second):
        assert report["windows"] == [] and report["errors"] == []
    assert all(json.loads(line) for line in stdout.decode().splitlines())


# --- help ------------------------------------------------------------------------------


def help_of(*command: str) -> str:
    environment = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "rabbitretry"), *command, "--help"],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def option_line(text: str, option: str) -> str:
    lines = [
        line
        for line in text.splitlines()
        if "--" in line and (f" {option} " in line or f" {option}," in line)
    ]
    assert lines, text
    return lines[0]


COMMANDS_WITH_VERBOSE = [
    ["run"],
    ["console"],
    ["reconcile"],
    ["outbox", "relay"],
    ["alerts", "deliver"],
    ["job", "run"],
]


@pytest.mark.parametrize("command", COMMANDS_WITH_VERBOSE)
def test_v_is_described_everywhere(command: list[str]) -> None:
    line = option_line(help_of(*command), "-v")
    assert "--verbose" in line
    assert line.rstrip(" │").split("<bool>")[-1].strip(), f"-v has no description: {line!r}"


def test_c_means_concurrency_and_only_that() -> None:
    assert "--concurrency" in option_line(help_of("run"), "-c")
    for command in (["console"], ["dead", "edit"]):
        text = help_of(*command)
        assert "--consumer" in text
        assert " -c " not in text, f"{command}: -c should mean --concurrency only"


def test_every_rate_takes_both_spellings() -> None:
    for command in (["dead", "replay"], ["reconcile"]):
        text = " ".join(help_of(*command).split())
        assert "--rate" in text
        assert "20 or 20/s" in text or "200 or 200/s" in text, text
        assert "/m" in text


def test_prune_says_what_older_than_accepts() -> None:
    text = " ".join(help_of("ledger", "prune").split())
    assert "such as 72h, 30d or 2w; at least 3d (72h)" in text


@pytest.mark.parametrize(
    ("command", "sentence"),
    [
        (
            ["status"],
            "Per queue: p95 and p99 end-to-end latency over the window (from the message's "
            "publish timestamp, or when the ledger first saw it, to its finish), the broker "
            'backlog ("unknown" when the broker is unreachable), messages retried',
        ),
        (
            ["alerts", "deliver"],
            "A refused or failed delivery is retried with a doubling backoff (5 s up to 5 min), "
            "never given up.",
        ),
        (
            ["console"],
            "Log in with RABBITRETRY_CONSOLE_TOKEN, a user of RABBITRETRY_CONSOLE_USERS_FILE, or "
            "RABBITRETRY_CONSOLE_USER and RABBITRETRY_CONSOLE_PASSWORD.",
        ),
    ],
)
def test_help_paragraphs_are_not_hard_wrapped(command: list[str], sentence: str) -> None:
    """At 250 columns a paragraph is one line: the docstring's own line breaks are gone."""
    assert any(sentence in line for line in help_of(*command).splitlines())


def test_prune_refuses_an_hour_saying_why(amqp_url: str, database_url: str) -> None:
    done = piped(amqp_url, database_url, "ledger", "prune", "--older-than", "1h")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --older-than 1h is too short: a retention window under 3 days would forget keys "
        "whose duplicates may still arrive (a copy parked in the delay chain comes back up to 47 "
        "hours later), and the ledger deduplicates only the keys it remembers"
    )


def test_reconcile_refuses_a_rate_it_cannot_read(amqp_url: str, database_url: str) -> None:
    done = piped(amqp_url, database_url, "reconcile", "--once", "--rate", "fast")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: 'fast' is not a rate like 20/s or 300/m"
