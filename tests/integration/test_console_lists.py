"""The console's lists and bulk actions over HTTP (in-process, real ledger): pages, totals,
sorting, export, and actions on every dead letter a group or a filter matches."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from rabbitretry.console import Auth, ConsoleConfig
from tests.integration.console_harness import (
    TOKEN,
    console_client,
    csrf_of,
    insert_many_dead,
    log_in,
    post,
)

pytestmark = pytest.mark.asyncio
KEY = re.compile(r'<td class="key"><a href="[^"]+">([^<]+)</a>')
NEXT = re.compile(r'<a rel="next" href="([^"]+)"')
PREVIOUS = re.compile(r'<a rel="prev" href="([^"]+)"')


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


def link(match: re.Match[str] | None) -> str:
    assert match, "no such link on the page"
    return match[1].replace("&amp;", "&")


async def walk(
    client: httpx.AsyncClient, first: str, items: re.Pattern[str] = KEY
) -> list[list[Any]]:
    """What ``items`` finds on every page, following Next from ``first`` to the end."""
    pages: list[list[Any]] = []
    url: str | None = first
    while url:
        page = await client.get(url)
        assert page.status_code == 200, page.text
        pages.append(items.findall(page.text))
        found = NEXT.search(page.text)
        url = link(found) if found else None
    return pages


async def test_every_message_is_on_exactly_one_page(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_many_dead(pool, 237, groups=3)
    first = await client.get("/messages")
    assert "50 shown of 237 messages" in first.text
    pages = await walk(client, "/messages")
    assert [len(p) for p in pages] == [50, 50, 50, 50, 37]
    keys = [k for p in pages for k in p]
    assert keys == [f"m-{n:06d}" for n in range(237, 0, -1)]  # newest first
    # The last page is the oldest fifty; Previous from there walks back towards the newest.
    last = await client.get("/messages?page=last")
    assert KEY.findall(last.text) == keys[-50:]
    before = await client.get(link(PREVIOUS.search(last.text)))
    assert KEY.findall(before.text) == keys[-100:-50]
    assert NEXT.search(before.text)


async def test_columns_sort_both_ways_and_filters_page_too(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_many_dead(pool, 120, groups=3)
    by_key = await walk(client, "/messages?sort=key&dir=asc&fingerprint=fp-1")
    keys = [k for p in by_key for k in p]
    assert keys == [f"m-{n:06d}" for n in range(1, 121) if n % 3 == 1]
    assert "40 shown of 40 messages" in (await client.get("/messages?fingerprint=fp-1")).text
    by_attempts = await walk(client, "/messages?sort=attempts&dir=desc")
    attempts = [n for n in range(120, 0, -1)]
    flat = [int(k[2:]) for p in by_attempts for k in p]
    assert sorted(flat) == sorted(attempts) and len(set(flat)) == 120
    # attempts = 1 + n % 5, largest first; ties by queue and key, descending.
    assert [1 + n % 5 for n in flat] == sorted((1 + n % 5 for n in flat), reverse=True)
    bad = await client.get("/messages?sort=payload")
    assert bad.status_code == 400 and "cannot sort by &#39;payload&#39;" in bad.text
    damaged = await client.get("/messages?after=%%%")
    assert damaged.status_code == 400 and "damaged" in damaged.text


async def test_groups_page_through_thousands(client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    await insert_many_dead(pool, 3000, queues=2, groups=1500)
    first = await client.get("/groups")
    assert "50 shown of 1,500 groups" in first.text
    names = re.compile(r'value="\[&#34;(q-\d)&#34;, &#34;(fp-\d+)&#34;\]"')
    seen = [group for page in await walk(client, "/groups?sort=queue", names) for group in page]
    assert len(seen) == len(set(seen)) == 1500


async def test_a_refresh_is_a_number_never_a_redirect(client: httpx.AsyncClient) -> None:
    page = await client.get("/messages?refresh=30")
    assert '<meta http-equiv="refresh" content="30">' in page.text
    evil = await client.get("/messages", params={"refresh": "0; url=https://evil.example/"})
    assert evil.status_code == 400 and "http-equiv" not in evil.text


async def test_the_filter_exports_as_json_lines(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_many_dead(pool, 30, groups=3)
    page = await client.get("/messages?fingerprint=fp-2")
    assert 'href="/export.jsonl?fingerprint=fp-2' in page.text
    exported = await client.get("/export.jsonl?fingerprint=fp-2")
    assert exported.status_code == 200
    assert "attachment" in exported.headers["content-disposition"]
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert len(lines) == 10 and {e["error_fingerprint"] for e in lines} == {"fp-2"}
    audit = await pool.fetchrow("SELECT action, messages FROM rabbitretry.audit")
    assert dict(audit) == {"action": "export", "messages": 10}


async def test_ignoring_a_group_is_confirmed_counted_and_undone(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_many_dead(pool, 300, groups=2)
    token = csrf_of((await client.get("/groups")).text)
    form = {
        "csrf": token,
        "action": "ignore",
        "group": '["q-0", "fp-1"]',
        "comment": "upstream fixed by hand",
    }
    confirm = await post(client, "/actions/confirm", form)
    assert confirm.status_code == 200 and "Ignore 150 dead letters?" in confirm.text
    assert (
        await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger WHERE status = 'dead'") == 300
    )
    echoed = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', confirm.text))
    echoed = {k: v.replace("&#34;", '"') for k, v in echoed.items()}
    done = await post(client, "/actions/bulk", echoed)
    assert done.status_code == 303
    shown = await client.get(done.headers["location"])
    assert "Ignored 150 dead letter(s)" in shown.text
    counts = dict(
        await pool.fetch("SELECT status, count(*) FROM rabbitretry.ledger GROUP BY status")
    )
    assert counts == {"dead": 150, "ignored": 150}
    batch = await pool.fetchval(
        "SELECT batch FROM rabbitretry.audit WHERE action = 'ignore-batch' AND messages = 150"
    )
    assert f'name="batch" value="{batch}"' in shown.text

    undo = await post(client, "/actions/unignore", {"csrf": token, "batch": batch})
    assert (
        "150 message(s) are dead letters again" in (await client.get(undo.headers["location"])).text
    )
    assert (
        await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger WHERE status = 'dead'") == 300
    )
    # Each message's time of death is back, so cutoffs still mean what they meant.
    assert not await pool.fetchval(
        "SELECT count(*) FROM rabbitretry.ledger WHERE finished_at > now() - interval '1 second'"
        " AND message_id = 'm-000001'"
    )
    actions = await pool.fetch(
        "SELECT action, count(*) AS n FROM rabbitretry.audit GROUP BY action ORDER BY action"
    )
    assert {r["action"]: r["n"] for r in actions} == {
        "ignore": 150,
        "ignore-batch": 1,
        "unignore": 150,
        "unignore-batch": 1,
    }


async def test_retrying_all_matching_needs_no_consumer_to_be_counted(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_many_dead(pool, 40, groups=4)
    token = csrf_of((await client.get("/messages")).text)
    confirm = await post(
        client,
        "/actions/confirm",
        {"csrf": token, "action": "retry", "q": "order 1", "rate": "100/s"},
    )
    # "order 1" matches orders 1, 10-19: eleven.
    assert confirm.status_code == 200 and "Retry 11 dead letters?" in confirm.text
    assert "q = order 1" in confirm.text and "100 per second" in confirm.text
    nothing = await post(
        client,
        "/actions/confirm",
        {"csrf": token, "action": "ignore", "q": "no such text", "comment": "x"},
    )
    assert nothing.status_code == 400 and "no dead letters match" in nothing.text
    no_comment = await post(
        client, "/actions/confirm", {"csrf": token, "action": "ignore", "q": "order"}
    )
    assert no_comment.status_code == 400 and "comment is required" in no_comment.text


async def test_the_overview_counts_and_charts_each_queue(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_many_dead(pool, 90, queues=2)
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts, finished_at,"
        " payload) SELECT 'q-1', 'ok-' || n, 'succeeded', 3, now(), '' FROM generate_series(1, 7) n"
    )
    page = await client.get("/")
    assert page.status_code == 200
    rows = re.findall(
        r'<tr>\s*<td class="key"><a href="/groups\?queue=(q-\d)">.*?</tr>', page.text, re.S
    )
    assert rows == ["q-0", "q-1"]
    assert 'href="/messages?queue=q-0">45</a>' in page.text
    assert "q-1: 7 handled, 45 died in the last 180 minutes" in page.text
    assert "<script" not in page.text and "<svg" in page.text
