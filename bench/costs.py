"""What a run costs per message, in figures a noisy machine moves less than the rates: the
consumer's own CPU time, and in the database the WAL bytes, commits, rows written, bytes stored
and the CPU time of the database server itself (when it runs on this machine).

Rates on a shared 2-core machine wobble by a fifth from one minute to the next. The counts
(WAL, commits, rows, bytes) barely move, so a change to the hot path shows its effect
there first; CPU times move less than rates, but a busy neighbour slows every instruction
too. The database figures are taken over every message of a run (its warm-up included, which
writes like the rest), the consumer's CPU time over the measured ones
(:class:`bench.throughput.Clock`). The arithmetic is pure and unit-tested; :func:`snapshot`
is the only part that talks to PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

# PostgreSQL's backends flush their statistics at most once a second (and when they go idle
# or exit): the figures after a run are read once this has passed.
STATS_SETTLE = 1.5

# Each variant's ledger tables; A has none.
RABBITRETRY_TABLES = ("rabbitretry.ledger", "rabbitretry.attempt")
NAIVE_TABLES = ("public.bench_naive",)

SNAPSHOT = """
SELECT pg_backend_pid() AS backend,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
       coalesce((SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables
                 WHERE relid = ANY (SELECT to_regclass(t) FROM unnest($1::text[]) AS t)), 0)
           ::bigint AS rows,
       coalesce((SELECT sum(pg_total_relation_size(to_regclass(t))) FROM unnest($1::text[]) AS t
                 WHERE to_regclass(t) IS NOT NULL), 0)::bigint AS bytes
"""


@dataclass(frozen=True)
class DatabaseSnapshot:
    wal: int
    """Bytes of WAL written since the server began (cluster-wide)."""
    commits: int
    """Transactions committed in the database."""
    rows: int
    """Rows inserted, updated and deleted in the tables."""
    bytes: int
    """The tables' size on disk, indexes and TOAST included."""
    server_cpu: float | None = None
    """Seconds of CPU the database server's processes have spent (None: not on this machine)."""


def per_message(
    before: DatabaseSnapshot, after: DatabaseSnapshot, messages: int, own_reads: int = 0
) -> dict[str, float]:
    """What the database did between two snapshots, per message; ``own_reads`` is how many
    read-only transactions the benchmark itself ran meanwhile (its progress checks, and the
    snapshot that opens the span), not counted as commits."""
    if messages <= 0:
        raise ValueError("no messages")
    found = {
        "wal_bytes": (after.wal - before.wal) / messages,
        "commits": (after.commits - before.commits - own_reads) / messages,
        "rows": (after.rows - before.rows) / messages,
        "table_bytes": (after.bytes - before.bytes) / messages,
    }
    if before.server_cpu is not None and after.server_cpu is not None:
        found["db_cpu_us"] = cpu_per_message(after.server_cpu - before.server_cpu, messages)
    return found


def cpu_per_message(cpu_seconds: float, messages: int) -> float:
    """Microseconds of the consumer's own CPU time per message."""
    if messages <= 0:
        raise ValueError("no messages")
    return cpu_seconds / messages * 1e6


def stat_cpu(stat: str, children: bool = False) -> tuple[int, int]:
    """(parent pid, CPU clock ticks in user and system mode) from the text of
    ``/proc/<pid>/stat``; with ``children``, the ticks of its children that ended and were
    waited for instead. The command name, in parentheses, may hold spaces and parentheses."""
    fields = stat.rsplit(")", 1)[1].split()
    # After the name: state, ppid, ... utime, stime, cutime and cstime are the 14th to 17th
    # fields of the line.
    first = 13 if children else 11
    return int(fields[1]), int(fields[first]) + int(fields[first + 1])


def tree_ticks(processes: Mapping[int, tuple[int, int]], root: int) -> int:
    """The CPU ticks of ``root`` and of all its descendants, from pid -> (parent pid, ticks)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in processes:
            total += processes[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks) of every process this machine shows (Linux ``/proc``)."""
    found: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                found[int(entry.name)] = stat_cpu((entry / "stat").read_text())
    return found


def process_tree_cpu(root: int) -> float:
    """Seconds of CPU spent so far by process ``root`` and its descendants (Linux ``/proc``):
    a worker whose pool runs in processes of its own, as Celery's prefork pool does."""
    return tree_ticks(processes(), root) / os.sysconf("SC_CLK_TCK")


def server_cpu(backend: int) -> float | None:
    """Seconds of CPU a PostgreSQL server has spent so far, found from one of its backends'
    pid: its postmaster's, its live processes' (backends, WAL writer, autovacuum...) and those
    of its processes that ended (the postmaster's waited-for children). Between two readings
    the difference is exact: a process that ended meanwhile is counted by its parent's total,
    less what it had spent at the first reading. None when the server is not on this machine
    (the pid is not a PostgreSQL process here)."""
    try:
        if Path(f"/proc/{backend}/comm").read_text().strip() != "postgres":
            return None
        postmaster = stat_cpu(Path(f"/proc/{backend}/stat").read_text())[0]
        _, ended = stat_cpu(Path(f"/proc/{postmaster}/stat").read_text(), children=True)
    except (OSError, IndexError, ValueError):
        return None
    return (tree_ticks(processes(), postmaster) + ended) / os.sysconf("SC_CLK_TCK")


async def snapshot(database_url: str, tables: Sequence[str]) -> DatabaseSnapshot:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(SNAPSHOT, list(tables))
        assert row is not None
        cpu = server_cpu(row["backend"])  # while the backend is there to find its server by
    finally:
        await conn.close()
    return DatabaseSnapshot(row["wal"], row["commits"], row["rows"], row["bytes"], cpu)


@contextlib.asynccontextmanager
async def database_costs(
    database_url: str,
    tables: Sequence[str],
    messages: Callable[[], int],
    own_reads: Callable[[], int] = lambda: 0,
) -> AsyncIterator[dict[str, float]]:
    """The database's costs per message of the block's work, filled in on the way out
    (``messages()``: how many it handled; ``own_reads()``: the benchmark's own read-only
    transactions in the block)."""
    found: dict[str, float] = {}
    before = await snapshot(database_url, tables)
    yield found
    await asyncio.sleep(STATS_SETTLE)
    after = await snapshot(database_url, tables)
    # The first snapshot's own transaction is counted in the second's figure.
    found.update(per_message(before, after, messages(), own_reads() + 1))
