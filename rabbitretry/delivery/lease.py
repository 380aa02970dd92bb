"""Keeping a claim's lease while its attempt runs, so that no other worker takes the work up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from rabbitretry.delivery.log_fields import LogFields
from rabbitretry.ledger import AttemptLedger, Key

log = logging.getLogger("rabbitretry.worker")


@contextlib.asynccontextmanager
async def lease_kept(
    ledger: AttemptLedger, key: Key, attempt: int, lease: float, fields: LogFields
) -> AsyncIterator[None]:
    """Renew the claim's lease every third of its length while the attempt runs.

    The renewing task starts only once a third of the lease has passed: most attempts
    end before that, and a task per attempt would cost every delivery.
    """
    renewers: list[asyncio.Task[None]] = []

    async def renew() -> None:
        while True:
            try:
                if not await ledger.renew_lease(key, attempt, lease):
                    log.warning(
                        "%s: attempt %d lost its lease",
                        key,
                        attempt,
                        extra=fields(key, attempt=attempt),
                    )
                    return
            except Exception as error:
                log.warning(
                    "%s: lease renewal failed (%s), will try again",
                    key,
                    error,
                    extra=fields(key, attempt=attempt),
                )
            await asyncio.sleep(lease / 3)

    timer = asyncio.get_running_loop().call_later(
        lease / 3, lambda: renewers.append(asyncio.create_task(renew()))
    )
    try:
        yield
    finally:
        timer.cancel()
        for renewer in renewers:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
