"""``rabbitretry console`` in a subprocess: it refuses unsafe starts and masks secrets."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.acceptance.cli_runner import CLI, ROOT
from tests.integration.harness import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "the console needs credentials"),
        (["--no-auth", "--host", "0.0.0.0"], {}, "--no-auth serves only 127.0.0.1"),
        (["--no-auth"], {"RABBITRETRY_CONSOLE_TOKEN": "t"}, "drop one"),
        ([], {"RABBITRETRY_CONSOLE_USER": "ops"}, "without RABBITRETRY_CONSOLE_PASSWORD"),
        (["--no-auth", "--consumer", "nomodule:X"], {}, "cannot import module 'nomodule'"),
        (
            [],
            {"RABBITRETRY_CONSOLE_USERS_FILE": "/nonexistent/users"},
            "cannot read the users file /nonexistent/users",
        ),
        (
            ["--no-auth"],
            {"RABBITRETRY_DATABASE_URL": "postgresql://u:s3cret@127.0.0.1:1/x"},
            "cannot connect to PostgreSQL at postgresql://u:***@127.0.0.1:1/x",
        ),
        (
            ["--no-auth"],
            {"RABBITRETRY_AMQP_URL": "amqp://guest:s3cret@127.0.0.1:1/"},
            "cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/",
        ),
    ],
)
async def test_unsafe_starts_are_refused(
    args: list[str], env: dict[str, str], message: str, database_url: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RABBITRETRY_CONSOLE_")}
    done = await asyncio.to_thread(
        subprocess.run,
        [*CLI, "console", *args],
        env={**clean, "RABBITRETRY_DATABASE_URL": database_url, **env, "COLUMNS": "250"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == (1 if "cannot connect" in message else 2), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


async def test_console_serves_with_a_token_and_masks_passwords(
    database_url: str,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    parts = urlsplit(database_url)
    netloc = f"{parts.username}:pa55word@{parts.hostname}:{parts.port}"
    with_password = urlunsplit(parts._replace(netloc=netloc))
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "console",
        "--port",
        str(port),
        "--consumer",
        "tests.acceptance.models:Orders",
        env={
            **os.environ,
            "RABBITRETRY_DATABASE_URL": with_password,
            "RABBITRETRY_CONSOLE_TOKEN": "tok",
        },
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def answering() -> httpx.Response | None:
                assert process.returncode is None, "the console exited"
                try:
                    return await client.get("/login")
                except httpx.TransportError:
                    return None

            login = await wait_for(answering, timeout=30)
            assert login.status_code == 200 and "postgres" not in login.text
            page = await client.get("/audit", headers={"authorization": "Bearer tok"})
            assert page.status_code == 200 and "postgres:***@" in page.text
            assert "pa55word" not in page.text
            assert (await client.get("/audit")).status_code == 303
    finally:
        process.terminate()
        _, output = await asyncio.wait_for(process.communicate(), timeout=30)
    stderr = output.decode()
    assert "console on http://127.0.0.1" in stderr and "postgres:***@" in stderr
    assert "pa55word" not in stderr
