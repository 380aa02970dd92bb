"""``rabbitretry ledger``: stats and prune, run as a user would."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import asyncpg

Cli = Callable[..., subprocess.CompletedProcess[str]]


async def test_prune_dry_run_then_prune(cli: Cli, pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts, finished_at,"
        " payload) VALUES ('q', 'old', 'succeeded', 3, now() - interval '40 days', '{}'),"
        " ('q', 'dead', 'dead', 3, now() - interval '40 days', '{}')"
    )
    dry = cli("ledger", "prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 ledger row(s)" in dry.stdout
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger") == 2

    done = cli("ledger", "prune", "--older-than", "30d")
    assert done.returncode == 0, done.stderr
    assert "removed 1 ledger row(s)" in done.stdout
    assert await pool.fetchval("SELECT message_id FROM rabbitretry.ledger") == "dead"


def test_prune_refuses_a_short_window_in_one_line(cli: Cli) -> None:
    result = cli("ledger", "prune", "--older-than", "2h")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "under 3 days" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_prune_explains_a_malformed_window(cli: Cli) -> None:
    result = cli("ledger", "prune", "--older-than", "soon")
    assert result.returncode == 2
    assert "not a duration" in result.stderr


def test_stats_counts_per_queue_and_status(cli: Cli) -> None:
    result = cli("ledger", "stats")
    assert result.returncode == 0, result.stderr
    assert "the ledger is empty" in result.stdout


async def test_prune_compacts_old_successes_and_stats_count_them(
    cli: Cli, pool: asyncpg.Pool
) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " finished_at, payload, headers, properties)"
        " VALUES ('q', 'week-old', 'succeeded', 2, 3, now() - interval '10 days', NULL, NULL,"
        " '{}'), ('q', 'today', 'succeeded', 1, 3, now(), NULL, NULL, '{}')"
    )
    dry = cli("ledger", "prune", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "compact 1 succeeded message(s) from before" in " ".join(dry.stdout.split())

    done = cli("ledger", "prune", "--compact-after", "7d")
    assert done.returncode == 0, done.stderr
    assert "compacted 1 succeeded message(s)" in " ".join(done.stdout.split())
    assert await pool.fetchval("SELECT message_id FROM rabbitretry.ledger") == "today"

    shown = cli("dead", "show", "week-old", "--queue", "q")
    assert shown.returncode == 2 and "was compacted" in shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr

    stats = cli("ledger", "stats")
    assert stats.returncode == 0, stats.stderr
    compacted = [line for line in stats.stdout.splitlines() if "compacted" in line]
    assert len(compacted) == 1 and " 1 " in compacted[0] and " 2 " in compacted[0], stats.stdout


def test_prune_says_compaction_is_off(cli: Cli) -> None:
    result = cli("ledger", "prune", "--compact-after", "off")
    assert result.returncode == 0, result.stderr
    assert "compaction off" in result.stdout


def test_prune_refuses_a_compaction_window_that_cannot_work(cli: Cli) -> None:
    for window, says in (("2h", "sooner than 1 day"), ("30d", "shorter than the retention")):
        result = cli("ledger", "prune", "--compact-after", window)
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_short_window_prunes_without_compacting_by_default(cli: Cli) -> None:
    result = cli("ledger", "prune", "--older-than", "72h")
    assert result.returncode == 0, result.stderr
    assert "compaction off" in result.stdout
