"""The console in a real browser (Debian's chromium, driven by Playwright) over the real ledger.

An operator logs in, filters, opens a group and retries it with a canary, ignores a message
with a comment, edits one and retries it; the ledger and the audit table are checked after
each step. On a ledger of 100,000 dead letters, another pages, sorts, ignores a whole group
and undoes it, and retries all a filter matches; hostile keys must not bend the layout. Set
RABBITRETRY_SCREENSHOTS=docs/images to refresh the documentation's pictures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import uvicorn

from rabbitretry import Consumer
from rabbitretry.console import Auth, ConsoleConfig, create_app
from tests.conftest import with_database
from tests.integration.console_harness import TOKEN, insert_dead, insert_many_dead
from tests.integration.dead_harness import Switch, dead_letters, orders_consumer
from tests.integration.harness import status_of, wait_for, wait_status

playwright_api = pytest.importorskip("playwright.async_api")
pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RABBITRETRY_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing (CI=true): apt-get install chromium")
        pytest.skip(f"{CHROMIUM} is not installed")
    async with playwright_api.async_playwright() as driver:
        launched = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


async def serve(config: ConsoleConfig) -> tuple[str, uvicorn.Server, asyncio.Task[None]]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await wait_for(started, timeout=15)
    return f"http://127.0.0.1:{port}", server, task


@contextlib.asynccontextmanager
async def served(config: ConsoleConfig) -> AsyncIterator[str]:
    """The console on a free local port for the block; its base URL."""
    base, server, task = await serve(config)
    try:
        yield base
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=15)


async def logged_in(browser: Any, base: str, **options: Any) -> Any:
    """A page of a new browser context, logged in as carol."""
    context = await browser.new_context(**{"viewport": {"width": 1280, "height": 760}, **options})
    page = await context.new_page()
    await page.goto(f"{base}/login")
    await page.fill("input[name=token]", TOKEN)
    await page.fill("input[name=name]", "carol")
    await page.click("form.login button[type=submit]")
    await page.wait_for_url(f"{base}/")
    return page


async def audit(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT actor, action, message_id, messages, comment FROM rabbitretry.audit ORDER BY id"
    )
    return [dict(r) for r in rows]


async def test_an_operator_works_through_the_dead_letters(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    browser: Any,
    shots: Path,
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {
        **{f"o-{n}": {"order": n} for n in range(4)},
        "neg": {"order": -1, "note": "sign error"},
        "skip": {"order": -2},
        "evil": {"order": -3, "note": "<script>alert('owned')</script>"},
    }
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        models={queue_name: consumer.payload_adapter},
    )
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        base, server, task = await serve(config)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 760})
            page = await context.new_page()
            dialogs: list[str] = []
            page.on("dialog", lambda dialog: dialogs.append(dialog.message))

            # Log in: every page sends a stranger to the login form first.
            await page.goto(f"{base}/messages")
            assert "/login" in page.url
            await page.screenshot(path=shots / "console-login.png")
            await page.fill("input[name=token]", "wrong")
            await page.click("button[type=submit]")
            await page.get_by_text("wrong credentials").wait_for()
            await page.fill("input[name=token]", TOKEN)
            await page.fill("input[name=name]", "alice")
            await page.click("form.login button[type=submit]")
            await page.wait_for_url(f"{base}/messages")
            assert await page.locator("table.list tbody tr").count() == 7
            await page.screenshot(path=shots / "console-messages.png", full_page=True)

            # Filter: text search over keys and errors.
            await page.fill("input[name=q]", "order 1 not")
            await page.click("form.filters button[type=submit]")
            await page.wait_for_url("**q=order+1+not*")
            assert await page.locator("table.list tbody tr").count() == 1
            assert "o-1" in await page.locator("table.list tbody").inner_text()

            # Open the group of "order N not found" failures.
            await page.goto(f"{base}/groups")
            example = page.locator("table.groups tbody tr", has_text="order 0 not found")
            fingerprint = await example.locator("td a").first.inner_text()
            group = page.locator("table.groups tbody tr", has_text=fingerprint)
            assert await group.count() == 1
            assert await group.locator("td.num").inner_text() == "4"
            await page.screenshot(path=shots / "console-groups.png", full_page=True)
            await group.locator("td a").first.click()
            await page.wait_for_url("**fingerprint=*")
            keys = await page.locator("table.list td.key").all_inner_texts()
            assert sorted(keys) == ["o-0", "o-1", "o-2", "o-3"]

            # Once the consumer is mended: retry a selection, then the rest of the group with
            # a canary (and the default cutoff: now).
            Broken.broken = False
            await page.check("input[aria-label='select o-0']")
            await page.check("input[aria-label='select o-1']")
            await page.click("button:has-text('Retry selected')")
            await page.wait_for_url("**/jobs/*")
            await page.locator(".state.finished").wait_for(timeout=60_000)
            assert "replayed 2 of 2" in await page.locator(".state").inner_text()
            for n in range(2):
                await wait_status(pool, queue_name, f"o-{n}", "succeeded")
            await page.goto(f"{base}/groups")
            assert await group.locator("td.num").inner_text() == "2"
            await group.locator("input[type=radio]").check()
            await page.click("button:has-text('Retry group…')")
            await page.get_by_role("heading", name="Retry 2 dead letters?").wait_for()
            await page.click("form.confirm button[type=submit]")
            await page.wait_for_url("**/jobs/*")
            await page.locator(".state.finished").wait_for(timeout=60_000)
            summary = await page.locator(".state").inner_text()
            assert f"replayed 2 of 2; canary {queue_name}/o-2 succeeded" in summary
            await page.screenshot(path=shots / "console-job.png")
            for n in range(2, 4):
                await wait_status(pool, queue_name, f"o-{n}", "succeeded")
            batches = [r for r in await audit(pool) if r["action"] == "replay-batch"]
            assert (
                batches
                == [
                    {
                        "actor": "console:alice",
                        "action": "replay-batch",
                        "message_id": None,
                        "messages": 2,
                        "comment": None,
                    }
                ]
                * 2
            )

            # Ignore one with a comment.
            await page.goto(f"{base}/message?queue={queue_name}&id=skip")
            await page.fill("input[name=comment]", "customer cancelled the order")
            await page.click("button:has-text('Ignore')")
            await page.get_by_role("status").filter(has_text="ignored").wait_for()
            assert await status_of(pool, queue_name, "skip") == "ignored"
            assert (await audit(pool))[-1]["comment"] == "customer cancelled the order"
            assert "customer cancelled the order" in await page.locator("table.audit").inner_text()

            # Edit one: the model refuses a wrong payload, a fixed one is retried.
            await page.goto(f"{base}/message?queue={queue_name}&id=neg")
            await page.click("summary:has-text('Edit the payload')")
            await page.fill("textarea[name=payload]", '{"order": "minus one"}')
            await page.click("button:has-text('Save and retry')")
            await page.get_by_role("alert").filter(has_text="does not fit").wait_for()
            assert await status_of(pool, queue_name, "neg") == "dead"
            await page.screenshot(path=shots / "console-edit.png", full_page=True)
            await page.fill("textarea[name=payload]", '{"order": 1, "note": "sign fixed"}')
            await page.fill("form.edit input[name=comment]", "sign typo")
            await page.click("button:has-text('Save and retry')")
            await page.get_by_role("status").filter(has_text="edited and retried").wait_for()
            await wait_status(pool, queue_name, "neg", "succeeded")
            assert (await audit(pool))[-1]["action"] == "edit-replay"

            # A payload with a script is shown as text and never runs.
            await page.goto(f"{base}/message?queue={queue_name}&id=evil")
            assert (
                "<script>alert('owned')</script>" in await page.locator("pre.payload").inner_text()
            )
            assert await page.locator("main script").count() == 0
            await page.screenshot(path=shots / "console-message.png", full_page=True)
            assert dialogs == []

            # Retry one: it fails again (the order does not exist), and the page says so.
            await page.click("button:has-text('Retry')")
            await page.get_by_role("status").filter(has_text="retried").wait_for()

            async def died_again() -> bool:
                row = await pool.fetchrow(
                    "SELECT status, replays FROM rabbitretry.ledger"
                    " WHERE queue = $1 AND message_id = 'evil'",
                    queue_name,
                )
                return row is not None and (row["status"], row["replays"]) == ("dead", 1)

            await wait_for(died_again)
            assert (await audit(pool))[-1]["action"] == "replay"
            await page.goto(f"{base}/audit")
            assert "console:alice" in await page.locator("table.audit").inner_text()
            await page.screenshot(path=shots / "console-audit.png", full_page=True)

            # Strangers and other sites are refused; nothing changes.
            stranger = await browser.new_context()
            other = await stranger.new_page()
            await other.goto(f"{base}/groups")
            assert "/login" in other.url
            anonymous = await stranger.request.post(
                f"{base}/actions/ignore",
                form={"key": f'["{queue_name}", "evil"]', "comment": "x"},
                max_redirects=0,
            )
            assert anonymous.status == 401
            await stranger.close()
            forged = await context.request.post(
                f"{base}/actions/ignore",
                form={"key": f'["{queue_name}", "evil"]', "comment": "x", "csrf": "guess"},
                headers={"Origin": "http://evil.example"},
            )
            assert forged.status == 403
            assert await status_of(pool, queue_name, "evil") == "dead"
            await context.close()
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, timeout=15)


async def test_long_and_hostile_keys_keep_the_page_in_shape(
    database_url: str, amqp_url: str, pool: asyncpg.Pool, browser: Any
) -> None:
    long_key = "k" * 3000
    await insert_dead(pool, "orders", long_key, b"{}", error="E" * 3000)
    await insert_dead(pool, "orders", "invoice-\u202egpj.exe", bytes([0, 0xFF]))
    config = ConsoleConfig(database_url=database_url, amqp_url=amqp_url, auth=Auth(token=TOKEN))
    async with served(config) as base:
        page = await logged_in(browser, base)
        for path in ("/messages", "/groups", f"/message?queue=orders&id={long_key}"):
            await page.goto(f"{base}{path}")
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, (path, width)
        await page.goto(f"{base}/messages")
        shown = await page.locator("table.list").inner_text()
        assert "invoice-[U+202E]gpj.exe" in shown
        phone = await logged_in(browser, base, viewport={"width": 390, "height": 800})
        await phone.goto(f"{base}/messages")
        logout = await phone.locator("header button", has_text="Log out").bounding_box()
        assert logout is not None and logout["x"] + logout["width"] <= 390


BIG = 100_000
GROUPS = 6_000


@pytest.fixture(scope="module")
def big_ledger(server_database_url: str, template_database: str) -> Iterator[tuple[str, str]]:
    """A ledger of 100,000 dead letters in 6,000 groups over 4 queues, built once for the
    module (one INSERT ... SELECT generate_series); its URL and its queues' name prefix."""
    name = f"rabbitretry_test_big_{secrets.token_hex(4)}"
    prefix = f"rr-big-{secrets.token_hex(3)}-"
    url = with_database(server_database_url, name)

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(server_database_url)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    async def fill() -> None:
        await admin(f"CREATE DATABASE {name} TEMPLATE {template_database}")
        conn = await asyncpg.connect(url)
        try:
            await insert_many_dead(conn, BIG, queues=4, groups=GROUPS, prefix=prefix)
            await conn.execute("ANALYZE rabbitretry.ledger")
        finally:
            await conn.close()

    asyncio.run(fill())
    yield url, prefix
    asyncio.run(admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def test_an_operator_pages_and_acts_on_a_hundred_thousand_dead_letters(
    big_ledger: tuple[str, str],
    amqp_url: str,
    amqp_connection: Any,
    broker_cleanup: Any,
    browser: Any,
    shots: Path,
) -> None:
    url, prefix = big_ledger
    config = ConsoleConfig(database_url=url, amqp_url=amqp_url, auth=Auth(token=TOKEN))
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    async with served(config) as base:
        page = await logged_in(browser, base)

        # The overview is the landing page: four queues, their counts, a chart each.
        rows = page.locator("table.overview tbody tr")
        assert await rows.count() == 4
        assert await page.locator("table.overview svg.chart").count() == 4
        first_queue = rows.nth(0)
        assert await first_queue.locator("td.num").nth(0).inner_text() == "25,000"
        await page.screenshot(path=shots / "console-overview.png", full_page=True)
        await first_queue.locator("td.num a").first.click()
        await page.wait_for_url(f"**/messages?queue={prefix}0")
        assert "50 shown of 25,000 messages" in await page.locator(".pager").first.inner_text()

        # Paging: Next, then the oldest first by the Changed column, then the last page.
        await page.goto(f"{base}/messages")
        assert "50 shown of 100,000 messages" in await page.locator(".pager").first.inner_text()
        keys = page.locator("table.messages td.key")
        assert await keys.first.inner_text() == "m-100000"
        await page.locator("a[rel=next]").first.click()
        await page.wait_for_url("**after=*")
        assert await keys.first.inner_text() == "m-099950"
        await page.click("th a:has-text('Changed (UTC)')")
        await page.wait_for_url("**dir=asc*")
        assert await keys.first.inner_text() == "m-000001"
        await page.click("text=Last »")
        assert await keys.last.inner_text() == "m-100000"
        await page.screenshot(path=shots / "console-paging.png")

        # Groups: all 6,000 are reachable; ignore one whole group, then undo it.
        await page.goto(f"{base}/groups")
        assert "50 shown of 6,000 groups" in await page.locator(".pager").first.inner_text()
        await page.screenshot(path=shots / "console-group-panel.png")
        group = page.locator("table.groups tbody tr").nth(0)
        fingerprint = await group.locator("td.key").inner_text()
        size = int(await group.locator("td.num").inner_text())
        await group.locator("input[type=radio]").check()
        await page.fill("fieldset.panel input[name=comment]", "known upstream outage")
        await page.click("button:has-text('Ignore group…')")
        await page.get_by_role("heading", name=f"Ignore {size} dead letters?").wait_for()
        await page.click("form.confirm button[type=submit]")
        await page.get_by_role("status").filter(has_text=f"Ignored {size} dead letter").wait_for()
        ignored = "SELECT count(*) FROM rabbitretry.ledger WHERE status = 'ignored'"
        assert await pool.fetchval(ignored) == size
        assert fingerprint in await page.locator("table.audit tbody tr").first.inner_text()
        await page.screenshot(path=shots / "console-undo.png")
        await page.click("button:has-text('Undo: back to dead')")
        await page.get_by_role("status").filter(has_text="dead letters again").wait_for()
        assert await pool.fetchval(ignored) == 0

        # Retry everything a filter matches (keys m-000100 to m-000199 of one queue: 25),
        # through the confirmation page; no consumer runs, so no canary.
        channel = await amqp_connection.channel()
        await channel.declare_queue(broker_cleanup.queue(f"{prefix}1"))
        await page.goto(f"{base}/messages?queue={prefix}1&q=m-0001")
        await page.uncheck("fieldset.panel input[name=canary]")
        await page.click("button:has-text('Retry all matching…')")
        await page.get_by_role("heading", name="Retry 25 dead letters?").wait_for()
        await page.screenshot(path=shots / "console-confirm.png")
        await page.click("form.confirm button[type=submit]")
        await page.wait_for_url("**/jobs/*")
        await page.locator(".state.finished").wait_for(timeout=60_000)
        retrying = "SELECT count(*) FROM rabbitretry.ledger WHERE status = 'retrying'"
        assert await pool.fetchval(retrying) == 25
    await pool.close()
