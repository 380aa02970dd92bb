"""The console's Downstreams panel on the overview (in-process console, real ledger): each
breaker's state, colour-coded, with its failures, probes and queues; an operator holds one
open or closes it there, with the CSRF token, from the console's origin, audited."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from rabbitretry.console import Auth, ConsoleConfig
from rabbitretry.ledger import downstreams
from tests.integration.console_harness import BASE, TOKEN, console_client, csrf_of, log_in, post


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


async def trip(pool: asyncpg.Pool, name: str, error: str = "HTTP 500") -> None:
    """A failure that opens ``name`` at once (threshold 1), its next probe 15 s away."""
    await pool.fetch(
        "SELECT * FROM rabbitretry.downstream_failed($1, 'w1', 1, 30, 15, 60, $2, 'q', 'm', 1)",
        name,
        error,
    )


def rows_of(html: str) -> dict[str, str]:
    """The panel's rows by downstream name (each row's HTML)."""
    panel = html.split('<h2 id="downstreams">', 1)[1]
    rows = re.findall(r'<tr class="downstream [^"]*">.*?</tr>', panel, re.S)
    named = {}
    for row in rows:
        name = re.search(r'<td class="key">([^<]*)</td>', row)
        assert name, row
        named[name[1]] = row
    return named


async def breaker(pool: asyncpg.Pool, name: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM rabbitretry.downstream WHERE name = $1", name)
    assert row is not None
    return row


async def test_the_overview_shows_each_breaker_colour_coded(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await downstreams.declare(pool, ["wms", "billing", "crm", "tax"], "orders.ship")
    await downstreams.declare(pool, ["wms"], "orders.return")
    await trip(pool, "wms", "<b>HTTP 500</b> from the WMS")
    await trip(pool, "tax")
    await pool.execute(
        "UPDATE rabbitretry.downstream SET state = 'half-open', probe_worker = 'w7'"
        " WHERE name = 'tax'"
    )
    await downstreams.force_open(pool, "billing", "cli:bob")
    for _ in range(2):
        await pool.fetch(
            "SELECT * FROM rabbitretry.downstream_failed('crm', 'w1', 5, 30, 1, 15, 'timeout',"
            " 'q', 'm', 1)"
        )

    page = await client.get("/")
    assert page.status_code == 200
    assert (
        "<b>HTTP 500" not in page.text and "&lt;b&gt;HTTP 500&lt;/b&gt; from the WMS" in page.text
    )
    rows = rows_of(page.text)
    assert list(rows) == ["billing", "crm", "tax", "wms"]

    wms = rows["wms"]
    assert '<span class="status open">open</span>' in wms
    assert re.search(r'<td class="num">1</td>\s*<td class="num">0</td>', wms)  # failures, probes
    assert re.search(r"<td>in 1\d s</td>", wms)  # the next probe, 15 s after the trip
    assert '<a href="/groups?queue=orders.ship">orders.ship</a>' in wms
    assert '<a href="/groups?queue=orders.return">orders.return</a>' in wms
    assert 'value="open">Hold open</button>' in wms and 'value="close"' in wms

    billing = rows["billing"]
    assert '<span class="status open">open (held)</span>' in billing
    assert "<td>none until closed</td>" in billing and "<td>cli:bob</td>" in billing
    assert "Hold open" not in billing and 'value="close"' in billing

    crm = rows["crm"]
    assert '<span class="status closed">closed</span>' in crm
    assert re.search(r'<td class="num">2</td>\s*<td class="num">-</td>', crm)
    assert "Hold open" in crm and 'value="close"' not in crm  # nothing to close

    tax = rows["tax"]
    assert '<span class="status half-open">half-open</span>' in tax
    assert "<td>probing (w7)</td>" in tax
    css = await client.get("/static/console.css")
    assert ".status.half-open" in css.text and ".status.open" in css.text


async def test_no_panel_without_breakers(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200 and "Downstreams" not in page.text


async def test_hold_open_and_close_from_the_console_are_audited(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await downstreams.declare(pool, ["wms"], "orders.ship")
    token = csrf_of((await client.get("/")).text)
    held = await post(
        client,
        "/actions/downstream",
        {"csrf": token, "name": "wms", "action": "open", "reason": "WMS upgrade"},
    )
    assert held.status_code == 303 and held.headers["location"] == "/?notice=downstream-held"
    row = await breaker(pool, "wms")
    assert (row["state"], row["forced"], row["forced_by"]) == ("open", "open", "console:alice")
    shown = await client.get(held.headers["location"])
    assert "Held open: the consumers that call it stop" in shown.text
    wms = rows_of(shown.text)["wms"]
    assert "open (held)" in wms and "<td>console:alice</td>" in wms

    closed = await post(
        client, "/actions/downstream", {"csrf": token, "name": "wms", "action": "close"}
    )
    assert closed.headers["location"] == "/?notice=downstream-closed"
    row = await breaker(pool, "wms")
    assert (row["state"], row["forced"]) == ("closed", None)

    audit = await pool.fetch(
        "SELECT actor, action, queue, comment FROM rabbitretry.audit ORDER BY id"
    )
    assert [dict(r) for r in audit] == [
        {
            "actor": "console:alice",
            "action": "downstream-open",
            "queue": "orders.ship",
            "comment": "WMS upgrade",
        },
        {
            "actor": "console:alice",
            "action": "downstream-close",
            "queue": "orders.ship",
            "comment": None,
        },
    ]
    page = await client.get("/audit")
    assert "downstream wms: closed → open (held)" in page.text
    assert "downstream wms: open (held) → closed" in page.text


async def test_a_downstream_action_needs_the_token_our_origin_and_a_known_name(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await trip(pool, "wms")
    token = csrf_of((await client.get("/")).text)
    form = {"csrf": token, "name": "wms", "action": "close"}
    no_token = await post(client, "/actions/downstream", {**form, "csrf": ""})
    assert no_token.status_code == 403 and "CSRF" in no_token.text
    cross_site = await client.post(
        "/actions/downstream", data=form, headers={"origin": "http://evil.example"}
    )
    assert cross_site.status_code == 403
    assert (await breaker(pool, "wms"))["state"] == "open"

    unknown = await post(client, "/actions/downstream", {**form, "name": "nope"})
    assert unknown.status_code == 400 and "no downstream named &#39;nope&#39;" in unknown.text
    odd = await post(client, "/actions/downstream", {**form, "action": "explode"})
    assert odd.status_code == 400 and "must be open or close" in odd.text
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.audit") == 0

    logged_out = httpx.AsyncClient(transport=client._transport, base_url=BASE)
    refused = await logged_out.post("/actions/downstream", data=form, headers={"origin": BASE})
    assert refused.status_code == 401


async def test_the_console_metrics_have_the_breakers(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await trip(pool, "wms")
    body = (await client.get("/metrics")).text
    assert 'rabbitretry_downstream_state{downstream="wms",state="open"} 1.0' in body
    assert 'rabbitretry_downstream_failures{downstream="wms"} 1.0' in body
