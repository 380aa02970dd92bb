"""The console over two ledger databases (``console --database A --database B``): every list
and panel shows both databases' rows, each labelled; an action goes to the database its row
came from; a database that is down is named on the pages, which answer for the other."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from rabbitretry import amqp, db
from rabbitretry.console import Auth, ConsoleConfig
from rabbitretry.ledger import downstreams
from rabbitretry.urls import database_labels
from tests.integration.conftest import BrokerCleanup
from tests.integration.console_harness import (
    TOKEN,
    console_client,
    csrf_of,
    insert_dead,
    insert_many_dead,
    log_in,
    post,
)
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio

NEXT = re.compile(r'<a rel="next" href="([^"]+)"')
KEY = re.compile(r'<td class="key"><a href="[^"]+">([^<]+)</a>')


@dataclass
class Two:
    client: httpx.AsyncClient
    first: asyncpg.Pool
    second: asyncpg.Pool
    first_label: str
    second_label: str


def config_for(first_url: str, second_url: str, amqp_url: str) -> ConsoleConfig:
    return ConsoleConfig(
        database_url=first_url,
        other_databases=(second_url,),
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )


@pytest.fixture
async def two(
    database_url: str, second_database_url: str, amqp_url: str, pool: asyncpg.Pool
) -> AsyncIterator[Two]:
    second = await db.create_pool(second_database_url, min_size=1, max_size=2)
    labels = database_labels([database_url, second_database_url])
    try:
        async with console_client(config_for(database_url, second_database_url, amqp_url)) as c:
            await log_in(c)
            yield Two(c, pool, second, labels[database_url], labels[second_database_url])
    finally:
        await second.close()


def labelled_row(label: str, message_id: str) -> re.Pattern[str]:
    """A list row of ``message_id`` whose database cell says ``label``."""
    return re.compile(
        rf'<td class="database">{re.escape(label)}</td>\s*<td>[^<]*</td>\s*'
        rf'<td class="key"><a href="[^"]*database={re.escape(label)}[^"]*">'
        rf"{re.escape(message_id)}</a>"
    )


async def test_every_page_shows_both_databases_rows_each_labelled(two: Two) -> None:
    await insert_dead(two.first, "orders", "o-1", b'{"order": 1}')
    await insert_dead(two.second, "payments", "p-1", b'{"payment": 1}', error="card declined")
    await downstreams.declare(two.second, ["bank"], "payments")

    listing = await two.client.get("/messages")
    assert listing.status_code == 200, listing.text
    assert labelled_row(two.first_label, "o-1").search(listing.text), listing.text
    assert labelled_row(two.second_label, "p-1").search(listing.text), listing.text
    assert f"Database {two.second_label}</h2>" in listing.text
    assert "Every dead letter these filters match (2, in every database)" in listing.text

    groups = await two.client.get("/groups")
    assert groups.status_code == 200
    for label, queue in ((two.first_label, "orders"), (two.second_label, "payments")):
        assert f'<td class="database">{label}</td>' in groups.text
        assert f"queue={queue}&amp;fingerprint=" in groups.text

    overview = await two.client.get("/")
    assert overview.status_code == 200
    assert f"/groups?queue=payments&amp;database={two.second_label}" in overview.text
    assert f"/groups?queue=orders&amp;database={two.first_label}" in overview.text
    bank = re.search(
        r'<tr class="downstream[^"]*">\s*<td class="database">([^<]+)</td>', overview.text
    )
    assert bank and bank[1] == two.second_label

    held = await post(
        two.client,
        "/actions/downstream",
        {
            "csrf": csrf_of(overview.text),
            "name": "bank",
            "action": "open",
            "database": two.second_label,
        },
    )
    assert held.status_code == 303, held.text
    opened = "SELECT count(*) FROM rabbitretry.audit WHERE action = 'downstream-open'"
    assert (await two.first.fetchval(opened), await two.second.fetchval(opened)) == (0, 1)
    gauges = (await two.client.get("/metrics")).text
    assert f'rabbitretry_ledger_up{{database="{two.first_label}"}} 1.0' in gauges
    assert (
        f'rabbitretry_downstream_state{{database="{two.second_label}",downstream="bank",'
        'state="open"} 1.0'
    ) in gauges

    found = await two.client.get(
        "/message", params={"queue": "payments", "id": "p-1", "database": two.second_label}
    )
    assert found.status_code == 200 and "card declined" in found.text
    assert json.dumps(["payments", "p-1", two.second_label]).replace('"', "&#34;") in found.text
    # Without its database, a key is looked up in the first one.
    assert (
        await two.client.get("/message", params={"queue": "payments", "id": "p-1"})
    ).status_code == 404
    unknown = await two.client.get("/messages", params={"database": "elsewhere"})
    assert unknown.status_code == 400 and "shows no database &#39;elsewhere&#39;" in unknown.text
    assert "postgresql://" not in listing.text.split("<footer>")[0]


async def test_a_replay_goes_to_the_database_its_row_came_from(
    two: Two, queue_name: str, amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup
) -> None:
    channel = await amqp_connection.channel()
    queue = await channel.declare_queue(broker_cleanup.queue(queue_name))
    # The same key dead in both databases: only the second one's is asked for.
    await insert_dead(two.first, queue_name, "k1", b'{"from": "first"}')
    await insert_dead(two.second, queue_name, "k1", b'{"from": "second"}')
    page = await two.client.get(
        "/message", params={"queue": queue_name, "id": "k1", "database": two.second_label}
    )
    key = json.dumps([queue_name, "k1", two.second_label])
    done = await post(two.client, "/actions/replay", {"csrf": csrf_of(page.text), "key": key})
    assert done.status_code == 303, done.text
    assert f"database={two.second_label}" in done.headers["location"]

    status = "SELECT status FROM rabbitretry.ledger WHERE message_id = 'k1'"
    assert await two.second.fetchval(status) != "dead"
    assert await two.first.fetchval(status) == "dead"
    audit = "SELECT count(*) FROM rabbitretry.audit WHERE action = 'replay'"
    assert (await two.second.fetchval(audit), await two.first.fetchval(audit)) == (1, 0)
    replayed = await queue.get(timeout=5)
    assert json.loads(replayed.body) == {"from": "second"}
    await replayed.ack()

    # Ignoring the first one's, from its list row, touches the first database only.
    token = csrf_of((await two.client.get("/messages")).text)
    first_key = json.dumps([queue_name, "k1", two.first_label])
    ignored = await post(
        two.client, "/actions/ignore", {"csrf": token, "key": first_key, "comment": "dup"}
    )
    assert ignored.status_code == 303
    assert await two.first.fetchval(status) == "ignored"
    assert await two.second.fetchval(status) != "ignored"


async def test_bulk_ignore_confirms_per_database_and_undo_goes_back(two: Two) -> None:
    await insert_many_dead(two.first, 3, prefix="a-")
    await insert_many_dead(two.second, 2, prefix="b-")
    token = csrf_of((await two.client.get("/messages")).text)
    form = {"csrf": token, "action": "ignore", "comment": "noise"}
    confirm = await post(two.client, "/actions/confirm", form)
    assert confirm.status_code == 200, confirm.text
    assert f"{two.first_label}: 3, {two.second_label}: 2" in confirm.text
    done = await post(two.client, "/actions/bulk", form)
    assert done.headers["location"] == "/audit?notice=ignored-many&count=5"
    ignored = "SELECT count(*) FROM rabbitretry.ledger WHERE status = 'ignored'"
    assert (await two.first.fetchval(ignored), await two.second.fetchval(ignored)) == (3, 2)

    audit = await two.client.get("/audit")
    undo = re.findall(
        r'name="batch" value="([^"]+)"><input type="hidden" name="database" value="([^"]+)">',
        audit.text,
    )
    assert sorted(label for _, label in undo) == sorted([two.first_label, two.second_label])
    batch = next(b for b, label in undo if label == two.second_label)
    back = await post(
        two.client,
        "/actions/unignore",
        {"csrf": csrf_of(audit.text), "batch": batch, "database": two.second_label},
    )
    assert back.headers["location"] == "/audit?notice=unignored&count=2"
    assert (await two.first.fetchval(ignored), await two.second.fetchval(ignored)) == (3, 0)


async def test_each_database_pages_on_its_own(two: Two) -> None:
    await insert_many_dead(two.first, 3, prefix="a-")
    await insert_many_dead(two.second, 60, prefix="b-")
    first_page = await two.client.get("/messages")
    assert "3 shown of 3 messages" in first_page.text
    assert "50 shown of 60 messages" in first_page.text
    found = NEXT.findall(first_page.text)
    assert found and all(f"database={two.second_label}" in link for link in found)
    rest = await two.client.get(found[0].replace("&amp;", "&"))
    assert rest.status_code == 200
    assert f"Database {two.first_label}" not in rest.text  # the second database alone
    shown = KEY.findall(first_page.text) + KEY.findall(rest.text)
    assert len(shown) == 63 and len(set(shown)) == 60  # a- and b- keys share m-000001...
    assert NEXT.search(rest.text) is None


@pytest.fixture
async def second_behind_proxy(second_database_url: str) -> AsyncIterator[tuple[Proxy, str]]:
    """The second database behind a proxy a test can cut, and its URL through the proxy."""
    parts = urlsplit(second_database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        yield proxy, proxy.url_for(second_database_url)
    finally:
        await proxy.close()


async def test_a_database_that_is_down_is_named_and_the_other_answers(
    database_url: str,
    second_behind_proxy: tuple[Proxy, str],
    amqp_url: str,
    pool: asyncpg.Pool,
) -> None:
    proxy, second_url = second_behind_proxy
    labels = database_labels([database_url, second_url])
    await insert_dead(pool, "orders", "o-1", b"{}")
    async with console_client(config_for(database_url, second_url, amqp_url)) as client:
        await log_in(client)
        healthy = await client.get("/healthz")
        assert healthy.status_code == 200
        assert healthy.json()["checks"] == {
            f"database:{labels[database_url]}": "ok",
            f"database:{labels[second_url]}": "ok",
        }
        await proxy.cut(refuse=True)
        for path in ("/", "/messages", "/groups", "/audit"):
            page = await client.get(path)
            assert page.status_code == 200, (path, page.text)
            assert f"database {labels[second_url]} is left out: cannot reach the ledger" in (
                page.text
            )
        listing = await client.get("/messages")
        assert "o-1" in listing.text
        gone = await client.get(
            "/message", params={"queue": "q", "id": "k", "database": labels[second_url]}
        )
        assert gone.status_code == 503 and "cannot reach the ledger" in gone.text
        assert "127.0.0.1:" + str(proxy.port) in gone.text
        health = await client.get("/healthz")
        assert health.status_code == 503
        checks = health.json()["checks"]
        assert checks[f"database:{labels[database_url]}"] == "ok"
        assert checks[f"database:{labels[second_url]}"].startswith("the database")
        client.cookies.clear()  # a load balancer: told which, not why
        anonymous = await client.get("/healthz")
        assert anonymous.status_code == 503
        assert anonymous.json()["checks"] == {
            f"database:{labels[database_url]}": "ok",
            f"database:{labels[second_url]}": "unavailable",
        }


async def test_a_logout_that_misses_a_database_fails_and_lets_nothing_back_in(
    database_url: str, second_behind_proxy: tuple[Proxy, str], amqp_url: str
) -> None:
    proxy, second_url = second_behind_proxy
    async with console_client(config_for(database_url, second_url, amqp_url)) as client:
        await log_in(client)
        page = await client.get("/")
        assert page.status_code == 200
        await proxy.cut(refuse=True)
        out = await post(client, "/logout", {"csrf": csrf_of(page.text)})
        assert out.status_code == 503
        assert "the logout could not be recorded everywhere" in out.text
        assert "log out again once it answers" in out.text
        # The first database took it: the session is refused while it answers.
        refused = await client.get("/")
        assert refused.status_code == 303 and refused.headers["location"].startswith("/login")
