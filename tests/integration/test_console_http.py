"""The console over HTTP (in-process, real ledger): authentication, CSRF and escaping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from rabbitretry.console import Auth, ConsoleConfig
from tests.integration.console_harness import (
    BASE,
    TOKEN,
    console_client,
    csrf_of,
    insert_dead,
    log_in,
)

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def client(database_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url.replace("guest:guest", "guest:topsecret"),
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with console_client(config) as http:
        yield http


async def test_pages_need_a_login(client: httpx.AsyncClient) -> None:
    response = await client.get("/groups?queue=q")
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=/groups%3Fqueue%3Dq"
    refused = await client.post("/actions/ignore", data={"key": '["q", "k"]', "comment": "x"})
    assert refused.status_code == 401
    wrong = await client.post("/login", data={"token": "nope"}, headers={"origin": BASE})
    assert wrong.status_code == 401 and "wrong credentials" in wrong.text
    assert (await client.get("/messages")).status_code == 303
    for elsewhere in ("//evil.example/x", "/\\evil.example/x", "https://evil.example/"):
        away = await client.post(
            "/login", data={"token": TOKEN, "next": elsewhere}, headers={"origin": BASE}
        )
        assert away.headers["location"] == "/"
    await log_in(client)
    page = await client.get("/messages")
    assert page.status_code == 200 and "alice" in page.text
    bearer = httpx.AsyncClient(transport=client._transport, base_url=BASE)
    assert (await bearer.get("/audit", headers={"authorization": f"Bearer {TOKEN}"})).is_success
    assert (await bearer.get("/audit", headers={"authorization": "Bearer no"})).status_code == 303


async def test_actions_need_the_csrf_token_and_our_origin(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "k1", b'{"order": 1}')
    await log_in(client)
    page = await client.get("/message", params={"queue": "orders", "id": "k1"})
    token = csrf_of(page.text)
    form = {"key": '["orders", "k1"]', "comment": "not needed", "csrf": token}
    no_token = await client.post(
        "/actions/ignore", data={**form, "csrf": ""}, headers={"origin": BASE}
    )
    assert no_token.status_code == 403 and "CSRF" in no_token.text
    cross_site = await client.post(
        "/actions/ignore", data=form, headers={"origin": "http://evil.example"}
    )
    assert cross_site.status_code == 403 and "cross-site" in cross_site.text
    no_origin = await client.post("/actions/ignore", data=form)
    assert no_origin.status_code == 403
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.audit") == 0
    assert await pool.fetchval("SELECT status FROM rabbitretry.ledger") == "dead"

    done = await client.post("/actions/ignore", data=form, headers={"referer": f"{BASE}/message"})
    assert done.status_code == 303
    assert await pool.fetchval("SELECT status FROM rabbitretry.ledger") == "ignored"
    row = await pool.fetchrow("SELECT actor, action, comment FROM rabbitretry.audit")
    assert dict(row) == {"actor": "console:alice", "action": "ignore", "comment": "not needed"}
    shown = await client.get(done.headers["location"])
    assert "not needed" in shown.text and "console:alice" in shown.text
    assert "Ignored: it will not be retried" in shown.text
    crafted = await client.get("/messages", params={"notice": "Session expired: go to evil"})
    assert "evil" not in crafted.text


async def test_payloads_are_shown_inert(client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    evil = b'{"note": "<script>alert(1)</script>"}'
    await insert_dead(pool, "orders", "<img src=x onerror=alert(2)>", evil, error="<b>bold</b>")
    await log_in(client)
    listing = await client.get("/messages")
    detail = await client.get(
        "/message", params={"queue": "orders", "id": "<img src=x onerror=alert(2)>"}
    )
    groups = await client.get("/groups")
    for page in (listing, detail, groups):
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert "<b>bold" not in page.text and "<i>header" not in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail.text
    assert "&lt;b&gt;bold&lt;/b&gt;" in listing.text
    assert "topsecret" not in listing.text and "guest:***@" in listing.text


async def test_mistakes_are_shown_not_raised(client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    await insert_dead(pool, "orders", "k1", b'{"order": 1}')
    await log_in(client)
    token = csrf_of((await client.get("/messages")).text)
    nothing = await client.post("/actions/replay", data={"csrf": token}, headers={"origin": BASE})
    assert nothing.status_code == 400 and "select at least one" in nothing.text
    bad_rate = await client.post(
        "/actions/confirm",
        data={"csrf": token, "action": "retry", "group": '["orders", "abc"]', "rate": "fast"},
        headers={"origin": BASE},
    )
    assert bad_rate.status_code == 400 and "not a rate" in bad_rate.text
    no_comment = await client.post(
        "/actions/ignore",
        data={"csrf": token, "key": '["orders", "k1"]', "comment": ""},
        headers={"origin": BASE},
    )
    assert no_comment.status_code == 400 and "comment is required" in no_comment.text
    bad_filter = await client.get("/messages", params={"since": "soon"})
    assert bad_filter.status_code == 400 and "not a time" in bad_filter.text
    missing = await client.get("/message", params={"queue": "orders", "id": "nope"})
    assert missing.status_code == 404
    await pool.execute(
        "INSERT INTO rabbitretry.succeeded_key"
        " VALUES (rabbitretry.key_hash('orders', 'old'), now() - interval '9 days', 1)"
    )
    compacted = await client.get("/message", params={"queue": "orders", "id": "old"})
    assert compacted.status_code == 404 and "was compacted" in compacted.text


async def test_an_unreachable_broker_is_one_line(database_url: str, pool: asyncpg.Pool) -> None:
    await insert_dead(pool, "orders", "k1", b'{"order": 1}')
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url="amqp://guest:pw-7f3k@127.0.0.1:1/",
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with console_client(config) as client:
        await log_in(client)
        token = csrf_of((await client.get("/messages")).text)
        response = await client.post(
            "/actions/replay",
            data={"csrf": token, "key": '["orders", "k1"]'},
            headers={"origin": BASE},
        )
    assert response.status_code == 503
    assert "cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/" in response.text
    assert "pw-7f3k" not in response.text
    assert await pool.fetchval("SELECT status FROM rabbitretry.ledger") == "dead"


async def test_metrics_are_served_to_a_bearer_of_the_token(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "k1", b"{}")
    assert (await client.get("/metrics")).status_code == 303
    scraped = await client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    assert "rabbitretry_ledger_up 1.0" in scraped.text
    assert 'rabbitretry_ledger_messages{queue="orders",status="dead"} 1.0' in scraped.text
