"""``rabbitretry console --database A --database B`` in a subprocess: the option is documented,
and one console shows both ledger databases, each row labelled, with a health check per
database."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
from collections.abc import Callable

import asyncpg
import httpx
import pytest

from rabbitretry.urls import database_labels
from tests.acceptance.cli_runner import CLI, ROOT
from tests.integration.console_harness import insert_dead
from tests.integration.harness import wait_for

pytestmark = pytest.mark.slow


def test_help_documents_a_repeatable_database(
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = cli("console", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--database URL" in text
    assert "repeat for several" in text
    assert "an action goes to the database of its row" in text


@pytest.mark.asyncio
async def test_one_console_shows_two_ledger_databases(
    database_url: str, second_database_url: str
) -> None:
    for url, queue, key in ((database_url, "orders", "o-1"), (second_database_url, "pay", "p-1")):
        pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
        try:
            await insert_dead(pool, queue, key, b"{}")
        finally:
            await pool.close()
    labels = database_labels([database_url, second_database_url])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "console",
        "--port",
        str(port),
        "--database",
        database_url,
        "--database",
        second_database_url,
        env={**os.environ, "RABBITRETRY_CONSOLE_TOKEN": "tok"},
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def answering() -> httpx.Response | None:
                assert process.returncode is None, "the console exited"
                try:
                    return await client.get("/healthz")
                except httpx.TransportError:
                    return None

            health = await wait_for(answering, timeout=30)
            assert health.status_code == 200, health.text
            assert health.json() == {
                "status": "ok",
                "checks": {f"database:{label}": "ok" for label in labels.values()},
            }
            page = await client.get("/messages", headers={"authorization": "Bearer tok"})
            assert page.status_code == 200
            for url, key in ((database_url, "o-1"), (second_database_url, "p-1")):
                label = re.escape(labels[url])
                row = rf'<td class="database">{label}</td>\s*<td>[^<]*</td>\s*<td class="key">'
                assert re.search(rf'{row}<a href="[^"]*database={label}[^"]*">{key}</a>', page.text)
    finally:
        process.terminate()
        _, output = await asyncio.wait_for(process.communicate(), timeout=30)
    stderr = output.decode()
    assert all(label in stderr for label in labels.values()), stderr
