"""The console under hostile or unlucky conditions (in-process, real ledger and broker): forged
Host headers, guessed tokens, stolen cookies, database outages, NULs, bidi text, binary
payloads, and replays a restart must not lose."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from rabbitretry import amqp
from rabbitretry.console import Auth, ConsoleConfig, security
from rabbitretry.ledger import failures
from tests.integration.conftest import BrokerCleanup
from tests.integration.console_harness import (
    TOKEN,
    console_client,
    csrf_of,
    insert_dead,
    log_in,
    post,
)
from tests.integration.harness import wait_for
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio


def config_for(database_url: str, amqp_url: str, **overrides: object) -> ConsoleConfig:
    settings: dict[str, object] = {
        "database_url": database_url,
        "amqp_url": amqp_url,
        "auth": Auth(token=TOKEN),
        "allowed_hosts": ("console.test",),
        **overrides,
    }
    return ConsoleConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
async def idle_queue(
    queue_name: str, amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup
) -> str:
    """A work queue nothing consumes: a replay's copies wait there, its canary never ends."""
    channel = await amqp_connection.channel()
    await channel.declare_queue(broker_cleanup.queue(queue_name))
    return queue_name


@pytest.fixture
async def client(database_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with console_client(config_for(database_url, amqp_url)) as http:
        yield http


async def test_a_foreign_host_is_refused_even_without_auth(
    database_url: str, amqp_url: str, pool: asyncpg.Pool
) -> None:
    # A DNS-rebinding page at evil.example reaches 127.0.0.1 with its own name in Host and
    # Origin: the console must not treat it as itself.
    await insert_dead(pool, "orders", "k1", b"{}")
    config = config_for(
        database_url, amqp_url, auth=Auth(), no_auth=True, allowed_hosts=("127.0.0.1",)
    )
    async with console_client(config, base="http://evil.example:8089") as evil:
        page = await evil.get("/messages")
        assert page.status_code == 400 and "not served" in page.text
        assert "set-cookie" not in page.headers
        assert "default-src 'none'" in page.headers["content-security-policy"]
        forged = await post(evil, "/actions/ignore", {"key": '["orders", "k1"]', "comment": "x"})
        assert forged.status_code == 400
    async with console_client(config, base="http://127.0.0.1:8089") as local:
        assert (await local.get("/messages")).status_code == 200
    assert await pool.fetchval("SELECT status FROM rabbitretry.ledger") == "dead"


async def test_guessing_the_token_is_throttled_and_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rabbitretry.console")
    for guess in range(10):
        wrong = await post(client, "/login", {"token": f"guess-{guess}"})
        assert wrong.status_code == 401
    throttled = await post(client, "/login", {"token": TOKEN, "name": "mallory"})
    assert throttled.status_code == 429 and "too many failed logins" in throttled.text
    assert int(throttled.headers["retry-after"]) > 0
    bearer = await client.get("/audit", headers={"authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 429
    failures = [r for r in caplog.records if "failed login" in r.getMessage()]
    assert len(failures) == 10 and "127.0.0.1" in failures[0].getMessage()


async def test_logout_revokes_the_session_everywhere(
    client: httpx.AsyncClient, database_url: str, amqp_url: str
) -> None:
    await log_in(client)
    stolen = client.cookies["rabbitretry_session"]
    token = csrf_of((await client.get("/messages")).text)
    out = await post(client, "/logout", {"csrf": token})
    assert out.status_code == 303
    client.cookies.set("rabbitretry_session", stolen)
    replayed = await client.get("/messages")
    assert replayed.status_code == 303 and replayed.headers["location"].startswith("/login")
    # Another console on the same ledger (or this one restarted) refuses it too.
    secret = b"s" * 32
    async with console_client(config_for(database_url, amqp_url, secret=secret)) as first:
        await log_in(first)
        cookie = first.cookies["rabbitretry_session"]
        token = csrf_of((await first.get("/messages")).text)
        await post(first, "/logout", {"csrf": token})
    async with console_client(config_for(database_url, amqp_url, secret=secret)) as second:
        second.cookies.set("rabbitretry_session", cookie)
        again = await second.get("/messages")
        assert again.status_code == 303


async def test_an_oversized_name_is_refused_not_a_login_loop(client: httpx.AsyncClient) -> None:
    response = await post(client, "/login", {"token": TOKEN, "name": "n" * 5000})
    assert response.status_code == 400 and "name is too long" in response.text
    assert "set-cookie" not in response.headers


async def test_a_database_outage_is_a_503_page(database_url: str, amqp_url: str) -> None:
    parts = urlsplit(database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        config = config_for(proxy.url_for(database_url), amqp_url)
        async with console_client(config) as client:
            await log_in(client)
            await proxy.cut(refuse=True)
            for path in ("/messages", "/groups", "/audit", "/message?queue=q&id=k", "/"):
                page = await client.get(path, follow_redirects=True)
                assert page.status_code == 503, (path, page.text)
                assert "cannot reach the ledger" in page.text
                assert 'href="/groups"' in page.text  # the navigation is there
                assert "default-src 'none'" in page.headers["content-security-policy"]
    finally:
        await proxy.close()


@pytest.mark.parametrize(
    "query",
    [
        {"q": "a\x00b"},
        {"queue": "\x00"},
        {"fingerprint": "fp\x00"},
        {"error": "E\x00"},
    ],
)
async def test_a_nul_in_a_filter_is_a_400(client: httpx.AsyncClient, query: dict[str, str]) -> None:
    await log_in(client)
    for path in ("/messages", "/groups"):
        page = await client.get(path, params=query)
        assert page.status_code == 400 and "NUL" in page.text, page.text


async def test_a_nul_in_a_key_is_a_400(client: httpx.AsyncClient) -> None:
    await log_in(client)
    page = await client.get("/message", params={"queue": "orders", "id": "k\x00"})
    assert page.status_code == 400 and "NUL" in page.text
    token = csrf_of((await client.get("/messages")).text)
    posted = await post(
        client, "/actions/ignore", {"csrf": token, "key": '["orders", "k\\u0000"]', "comment": "x"}
    )
    assert posted.status_code == 400 and "NUL" in posted.text


async def test_bidi_controls_are_shown_not_obeyed(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "invoice-\u202egpj.exe", b"{}", error="bad \u2066text")
    await log_in(client)
    for page in (
        await client.get("/messages"),
        await client.get("/message", params={"queue": "orders", "id": "invoice-\u202egpj.exe"}),
    ):
        assert page.status_code == 200
        assert "\u202e" not in page.text and "\u2066" not in page.text
        assert "invoice-[U+202E]gpj.exe" in page.text


async def test_a_binary_payload_is_shown_in_hex_and_base64(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "bin", bytes([0, 1, 0xFF, 0xFE, 65]))
    await log_in(client)
    page = await client.get("/message", params={"queue": "orders", "id": "bin"})
    assert page.status_code == 200
    assert "\ufffd" not in page.text
    assert "5 bytes, not text" in page.text
    assert "00 01 ff fe 41" in page.text and "AAH//kE=" in page.text


async def test_replays_are_kept_in_the_ledger_and_audited_by_group(
    database_url: str, amqp_url: str, pool: asyncpg.Pool, idle_queue: str
) -> None:
    # Nothing consumes the queue, so the canary never finishes: the replay stops, and both
    # the job page of another console and the audit page say which group and why.
    for n in range(3):
        await insert_dead(pool, idle_queue, f"k{n}", b"{}")
    fingerprint = failures.rejection(idle_queue, "Permanent", "order 1 not found").fingerprint
    config = config_for(database_url, amqp_url, canary_timeout=0.5)
    async with console_client(config) as first:
        await log_in(first)
        token = csrf_of((await first.get("/groups")).text)
        group = json.dumps([idle_queue, fingerprint])
        started = await post(
            first,
            "/actions/bulk",
            {"csrf": token, "action": "retry", "group": group, "canary": "on"},
        )
        assert started.status_code == 303
        job_page = started.headers["location"]

        async def finished() -> bool:
            return "state stopped" in (await first.get(job_page)).text

        await wait_for(finished, timeout=30)
    async with console_client(config) as second:
        await log_in(second, "bob")
        job = await second.get(job_page)
        assert job.status_code == 200
        assert f"canary {idle_queue}/k" in job.text and "stopped" in job.text, job.text
        audit = await second.get("/audit")
        assert fingerprint in audit.text and "stopped" in audit.text
        assert job_page in audit.text
        rows = await pool.fetch("SELECT action FROM rabbitretry.audit ORDER BY id")
        assert [r["action"] for r in rows] == ["replay", "replay-batch"]
        # The canary's own row is there, but not listed among the operations.
        assert audit.text.count(">replay<") == 0


async def test_users_of_the_users_file_are_audited_by_their_own_name(
    database_url: str, amqp_url: str, pool: asyncpg.Pool
) -> None:
    await insert_dead(pool, "orders", "k1", b"{}")
    auth = Auth(token=TOKEN, users={"dana": security.hash_password("s3cret-pw")})
    async with console_client(config_for(database_url, amqp_url, auth=auth)) as client:
        login = await client.get("/login")
        assert 'name="user"' in login.text and 'name="token"' in login.text
        wrong = await post(client, "/login", {"user": "dana", "password": "nope"})
        assert wrong.status_code == 401
        right = await post(client, "/login", {"user": "dana", "password": "s3cret-pw"})
        assert right.status_code == 303
        page = await client.get("/message", params={"queue": "orders", "id": "k1"})
        done = await post(
            client,
            "/actions/ignore",
            {"csrf": csrf_of(page.text), "key": '["orders", "k1"]', "comment": "dup"},
        )
        assert done.status_code == 303
    assert await pool.fetchval("SELECT actor FROM rabbitretry.audit") == "console:dana"


async def test_a_replay_cut_short_by_a_restart_says_so(
    database_url: str, amqp_url: str, pool: asyncpg.Pool, idle_queue: str
) -> None:
    for n in range(2):
        await insert_dead(pool, idle_queue, f"k{n}", b"{}")
    config = config_for(database_url, amqp_url, canary_timeout=60)
    async with console_client(config) as first:
        await log_in(first)
        token = csrf_of((await first.get("/messages")).text)
        keys = [json.dumps([idle_queue, f"k{n}"]) for n in range(2)]
        started = await first.post(
            "/actions/replay",
            data={"csrf": token, "key": keys, "canary": "on"},
            headers={"origin": str(first.base_url)},
        )
        job_page = started.headers["location"]
        assert "state running" in (await first.get(job_page)).text
    async with console_client(config) as second:
        await log_in(second)
        shown = await second.get(job_page)
        assert "state failed" in shown.text and "interrupted: the console stopped" in shown.text
