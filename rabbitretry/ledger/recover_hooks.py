"""Recover hooks: which queues' dead messages get a run of their consumer's ``on_dead``.

The runs themselves are written by the trigger ``rabbitretry.recover_on_dead`` (migration
0012), in the transaction that makes a message dead, whichever statement does: an outbox row
for ``<queue>.recover`` under ``recover:<message_id>:<replays>``.
"""

from __future__ import annotations

from rabbitretry.db import Executor, Record, query


async def registered(executor: Executor, queue: str) -> str | None:
    """The recover queue registered for ``queue``, if any."""
    found: str | None = await executor.fetchval(query("recover_hook_of"), queue)
    return found


async def register(executor: Executor, queue: str, recover_queue: str) -> None:
    """From now on, a message of ``queue`` that ends dead gets a run in ``recover_queue``."""
    await executor.execute(query("recover_hook_register"), queue, recover_queue)


async def unregister(executor: Executor, queue: str) -> None:
    """``queue``'s consumer no longer has a hook: its dead messages get no run."""
    await executor.execute(query("recover_hook_unregister"), queue)


async def run_of(executor: Executor, queue: str, message_id: str) -> Record | None:
    """The latest run of the hook for dead message ``message_id`` of ``queue`` (its ledger row
    in the recover queue), or None."""
    return await executor.fetchrow(query("recover_hook_run"), queue, message_id)
