"""Every number the console takes from a query string or a form, sent absurd (1e309, -1,
10**30, NaN, ten thousand digits, a year 99999): a 400 page that says what was wrong, never a
500 or a traceback. In-process console, real ledger."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import httpx
import pytest

from rabbitretry.console import Auth, ConsoleConfig
from tests.integration.console_harness import (
    TOKEN,
    console_client,
    csrf_of,
    insert_dead,
    log_in,
    post,
)

pytestmark = pytest.mark.asyncio

HUGE = "1" + "0" * 30
DIGITS = "9" * 10_000
ABSURD_NUMBERS = ("1e309", "-1", HUGE, "NaN", "inf", DIGITS, "0." + "0" * 400 + "1")
ABSURD_TIMES = (
    "99999-01-01T00:00",
    "1e309",
    "-1",
    DIGITS,
    "NaN",
    "9999-12-31T23:59-14:00",  # a valid datetime whose UTC is in year 10000
    "0001-01-01T00:00+14:00",  # ... and one whose UTC is in year 0
)
Send = Callable[[], Awaitable[httpx.Response]]


@pytest.fixture
async def client(database_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with console_client(config) as http:
        await log_in(http)
        yield http


def cursor(*values: object, raw: str | None = None) -> str:
    """A page link's cursor as the console encodes it, holding what a forger chose."""
    text = raw if raw is not None else json.dumps(list(values))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


async def refusals(cases: dict[str, Send], expected: int = 400) -> list[str]:
    """What went wrong with each case: a status other than ``expected``, a traceback in the
    page, or an exception out of the app (what a server turns into a 500)."""
    wrong = []
    for name, send in cases.items():
        try:
            response = await send()
        except Exception as error:  # the app raised: a 500 in a real server
            wrong.append(f"{name}: raised {type(error).__name__}: {str(error)[:120]}")
            continue
        if response.status_code != expected:
            wrong.append(f"{name}: {response.status_code} {response.text[:200]!r}")
        elif "Traceback" in response.text:
            wrong.append(f"{name}: a traceback in the page")
    return wrong


def getter(client: httpx.AsyncClient, path: str, params: dict[str, str]) -> Send:
    return lambda: client.get(path, params=params)


def poster(client: httpx.AsyncClient, path: str, data: dict[str, str]) -> Send:
    return lambda: post(client, path, data)


async def test_absurd_times_in_a_filter_are_400(client: httpx.AsyncClient) -> None:
    cases = {
        f"{path}?{field}={value[:30]}": getter(client, path, {field: value, "status": "all"})
        for path in ("/messages", "/groups", "/export.jsonl")
        for field in ("since", "until")
        for value in ABSURD_TIMES
    }
    assert await refusals(cases) == []


async def test_absurd_values_in_a_page_cursor_are_400(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "k1", b"{}")
    sorts = {
        "/messages": {"changed": ABSURD_TIMES, "attempts": ABSURD_NUMBERS},
        "/groups": {"last_seen": ABSURD_TIMES, "messages": ABSURD_NUMBERS},
    }
    cases: dict[str, Send] = {}
    for path, columns in sorts.items():
        for column, values in columns.items():
            for value in values:
                for side in ("after", "before"):
                    link = {"sort": column, side: cursor(value, "orders", "k1")}
                    cases[f"{path} {column} {side}={value[:30]}"] = getter(client, path, link)
            # A number the JSON itself holds, not a string: 1e309 decodes to infinity.
            raw = cursor(raw='[1e309, "orders", "k1"]')
            cases[f"{path} {column} raw 1e309"] = getter(
                client, path, {"sort": column, "after": raw}
            )
    assert await refusals(cases) == []
    # The links the console makes itself still work.
    assert (await client.get("/messages", params={"sort": "attempts"})).status_code == 200


async def test_absurd_rates_and_cutoffs_in_a_bulk_action_are_400(
    client: httpx.AsyncClient, pool: asyncpg.Pool, queue_name: str
) -> None:
    # queue_name is declared nowhere: a replay a wrong refusal let through fails its publish.
    await insert_dead(pool, queue_name, "k1", b"{}")
    token = csrf_of((await client.get("/messages")).text)
    form = {"csrf": token, "action": "retry", "queue": queue_name}
    # A sensible rate is accepted: the refusals below are the numbers', not the form's.
    assert (await post(client, "/actions/confirm", {**form, "rate": "20/s"})).status_code == 200
    rates = (*ABSURD_NUMBERS, "1e309/s", f"{HUGE}/m", f"{DIGITS}/s")
    cases: dict[str, Send] = {
        f"{path} rate={rate[:30]}": poster(client, path, {**form, "rate": rate})
        for path in ("/actions/confirm", "/actions/bulk")
        for rate in rates
    }
    for field in ("before", "since", "until"):
        for value in ABSURD_TIMES:
            cases[f"confirm {field}={value[:30]}"] = poster(
                client, "/actions/confirm", {**form, field: value}
            )
    assert await refusals(cases) == []
    replay = {"csrf": token, "key": json.dumps([queue_name, "k1"]), "canary": "on"}
    replays = {
        f"replay rate={rate[:30]}": poster(client, "/actions/replay", {**replay, "rate": rate})
        for rate in rates
    }
    assert await refusals(replays) == []
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.console_job") == 0


async def test_absurd_counts_and_job_ids_are_no_500(client: httpx.AsyncClient) -> None:
    # A notice's count is only shown: an absurd one reads "some", the page is served.
    notices = {
        f"count={count[:30]}": getter(client, "/audit", {"notice": "unignored", "count": count})
        for count in (*ABSURD_NUMBERS, "\u00b2", "\u0661\u0662")
    }
    assert await refusals(notices, expected=200) == []
    jobs = {
        f"job {job_id[:30]}": getter(client, f"/jobs/{job_id}", {})
        for job_id in (*ABSURD_NUMBERS, "x" * 10_000)
    }
    assert await refusals(jobs, expected=404) == []
