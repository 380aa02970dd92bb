"""The end of a worker's run: waiting for in-flight attempts, then closing connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from rabbitretry import amqp

log = logging.getLogger("rabbitretry.worker")

BROKER_TIMEOUT = 5.0  # seconds a close may wait: with the broker away, it would wait for ever


async def drain(
    inflight: set[asyncio.Task[Any]], timeout: float, abandoning: asyncio.Event
) -> None:
    """Wait for the ``inflight`` attempts for ``timeout`` seconds (or until ``abandoning`` is
    set), then interrupt those still running: their deliveries are requeued."""
    if not inflight:
        return
    pending = set(inflight)
    if not abandoning.is_set():
        log.info(
            "waiting up to %.0f s for %d in-flight attempt(s)",
            timeout,
            len(pending),
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    abandon = asyncio.ensure_future(abandoning.wait())
    try:
        # Until every attempt is done, the timeout passes, or abandon() is called.
        while (running := {t for t in pending if not t.done()}) and not abandon.done():
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(
                {*running, abandon}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
    finally:
        abandon.cancel()
    still_running = {t for t in pending if not t.done()}
    if still_running and not abandoning.is_set():
        log.warning(
            "%d in-flight attempt(s) still running after %.0f s: interrupting them, their "
            "deliveries requeued",
            len(still_running),
            timeout,
        )
    for task in still_running:
        task.cancel()
    if still_running:
        await asyncio.wait(still_running, timeout=10)


async def close_connection(connection: amqp.Connection) -> None:
    with contextlib.suppress(*amqp.CHANNEL_ERRORS):
        await asyncio.wait_for(connection.close(), BROKER_TIMEOUT)
