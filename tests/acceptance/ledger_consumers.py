"""Consumers of ``rabbitretry run`` in a subprocess, in two ledger databases: ``Home`` in the
worker's (``RABBITRETRY_DATABASE_URL``), ``Away`` in ``RR_AWAY_DATABASE_URL``; their queues are
``RR_TEST_QUEUE`` with ``-home`` and ``-away``."""

from __future__ import annotations

import os

from pydantic import BaseModel

from rabbitretry import Consumer, Context

QUEUE = os.environ.get("RR_TEST_QUEUE", "rr-test-ledgers")


class Note(BaseModel):
    n: int = 0


class Home(Consumer[Note]):
    queue = f"{QUEUE}-home"

    async def handle(self, msg: Note, ctx: Context) -> None:
        pass


class Away(Consumer[Note]):
    queue = f"{QUEUE}-away"
    database_url = os.environ.get("RR_AWAY_DATABASE_URL")

    async def handle(self, msg: Note, ctx: Context) -> None:
        pass
