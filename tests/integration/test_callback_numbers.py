"""The callback receiver sent absurd numbers in its headers (real ledger): a 401 or a 413 with
a reason, nothing stored, never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from rabbitretry.callbacks import CallbackReceiver
from tests.integration.test_callbacks import body_of, client_for, kind_for, outbox_rows, post

pytestmark = pytest.mark.asyncio
ABSURD_TIMESTAMPS = (
    "1" + "0" * 400,  # too large for a float: the tolerance check overflowed
    "9" * 10_000,
    "-" + "9" * 400,
    "-1",
    "1e309",
    "NaN",
    "1_700_000_000",  # other scripts' digits: tests/unit (httpx sends ASCII headers only)
)


@pytest.fixture
async def receiver(pool: asyncpg.Pool, queue_name: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(CallbackReceiver([kind_for(queue_name)], pool=pool)) as http:
        yield http


async def test_an_absurd_signature_timestamp_is_401_and_stores_nothing(
    receiver: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    answers = {}
    for stamp in ABSURD_TIMESTAMPS:
        try:
            response = await post(receiver, body_of(), **{"x-signature-timestamp": stamp})
        except Exception as error:  # raised out of the app: a 500 in a real server
            answers[stamp[:20]] = f"raised {type(error).__name__}"
            continue
        answers[stamp[:20]] = f"{response.status_code} {response.json()['message']}"
    refused = "401 X-Signature-Timestamp is not a Unix time in seconds (ASCII digits)"
    assert answers == {stamp[:20]: refused for stamp in ABSURD_TIMESTAMPS}
    assert await outbox_rows(pool) == []
