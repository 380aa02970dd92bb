"""The README's path, every command of it, in order, exactly as written.

The commands are read from README.md's ``sh`` blocks between "## Quickstart" and
"## Documentation", so that a change to the README changes what this test runs. They run from
the repository's directory against a scratch database (created empty, so that ``db migrate``
does real work) and a scratch RabbitMQ virtual host (the README's consumer has a fixed queue
name, ``points.award``; a vhost of its own keeps this run apart from the demo and from other
test sessions on the same broker). The only liberties taken:

- ``.venv/bin/X`` is the ``X`` next to the Python running this test (the same virtualenv when
  the tests run through ``make test``);
- ``make demo`` and ``make test`` are not run: ``make test`` is what runs this test, and
  ``make demo``'s own services step is ``scripts/services.sh``, the script CI runs too;
- a command that runs until stopped is started in the background, checked to work (its HTTP
  endpoint answers, or its heartbeat is written), left running while the next commands run,
  and stopped with SIGTERM at the end, when it must exit 0;
- between commands the test waits for what the README says has happened (the published orders
  settled, the replayed order dead again), as a user reading the output would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pytest

from tests.webhook import WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

NOT_RUN = {"make demo", "make test"}  # see the module's docstring
FOREVER_NOTE = "run until you stop them"  # what the README says before those commands
EXIT_CODES = {"status": 3}  # the README: a dead letter is waiting, which is a breach
PUBLISHED = {
    "order-1001-paid": "succeeded",
    "order-1002-paid": "succeeded",
    "order-1003-paid": "succeeded",
    "order-1004-paid": "succeeded",  # after one timeout
    "order-1005-paid": "dead",  # the suspended user
}
DEAD = "order-1005-paid"
QUEUE = "points.award"


# --- the README ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    language: str
    lines: list[str]
    before: str
    """The prose between the previous block and this one."""


def readme_blocks() -> list[Block]:
    """The fenced code blocks of the README's path: from Quickstart up to Documentation."""
    text = README.read_text()
    path = text[text.index("## Quickstart") : text.index("## Documentation")]
    blocks: list[Block] = []
    end = 0
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", path, re.MULTILINE | re.DOTALL):
        blocks.append(Block(match[1], match[2].splitlines(), path[end : match.start()]))
        end = match.end()
    return blocks


@dataclass(frozen=True)
class Command:
    text: str
    argv: list[str]
    forever: bool


def readme_commands() -> list[Command]:
    commands = []
    for block in readme_blocks():
        if block.language != "sh":
            continue
        for line in block.lines:
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            text = shlex.join(argv)
            forever = runs_forever(argv)
            if forever:
                assert FOREVER_NOTE in " ".join(block.before.split()), (
                    f"README: `{text}` runs until stopped; the text before its block must say "
                    f"so ({FOREVER_NOTE!r}, with the advice to give each its own terminal)"
                )
            commands.append(Command(text, argv, forever))
    return commands


def runs_forever(argv: list[str]) -> bool:
    """Whether the CLI command keeps running until SIGTERM (it has no --once, or an interval)."""
    if Path(argv[0]).name != "rabbitretry":
        return False
    words = argv[1:]
    return (
        words[:1] in (["run"], ["console"])
        or (words[:1] == ["reconcile"] and "--interval" in words)
        or (words[:2] == ["alerts", "deliver"] and "--once" not in words)
    )


def test_the_readme_consumer_is_examples_points() -> None:
    """The README's consumer is an excerpt of examples/points.py, line for line and in order
    (the file may have more: docstrings, the stand-in points service, the demo's extra field)."""
    (snippet,) = [b for b in readme_blocks() if b.language == "python"]
    source = iter((ROOT / "examples" / "points.py").read_text().splitlines())
    for line in snippet.lines:
        if line.strip():
            assert any(line == candidate for candidate in source), (
                f"README.md's consumer has a line examples/points.py does not have here: {line!r}"
            )


def test_the_readme_path_is_what_this_test_knows() -> None:
    """Fails when the README gains a command this module does not know how to run."""
    texts = [c.text for c in readme_commands()]
    assert texts[:2] == sorted(NOT_RUN)
    assert all(t.startswith((".venv/bin/rabbitretry ", ".venv/bin/python ")) for t in texts[2:])
    assert any("examples.publish" in t for t in texts)
    assert [t for t in texts if DEAD in t], "the README no longer shows the dead letter's key"


# --- scratch services -----------------------------------------------------------------------------


@pytest.fixture
async def empty_database_url(server_database_url: str) -> AsyncIterator[str]:
    """A new database with nothing in it: the README starts with `db migrate`."""
    name = f"rabbitretry_readme_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server_database_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    yield urlunsplit(urlsplit(server_database_url)._replace(path=f"/{name}"))
    admin = await asyncpg.connect(server_database_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def _management_api(amqp_url: str, method: str, path: str, body: bytes | None = None) -> None:
    """A call to the management plugin's HTTP API (the docker-compose image has it)."""
    parts = urlsplit(amqp_url)
    request = urllib.request.Request(
        f"http://{parts.hostname}:15672/api/{path}",
        data=body,
        method=method,
        headers={"content-type": "application/json"},
    )
    credentials = f"{parts.username or 'guest'}:{parts.password or 'guest'}"
    request.add_header("authorization", f"Basic {base64.b64encode(credentials.encode()).decode()}")
    urllib.request.urlopen(request, timeout=10).close()


def _create_vhost(amqp_url: str, vhost: str) -> Callable[[], None]:
    """Create ``vhost`` with every permission for the URL's user; the function that deletes it.

    With rabbitmqctl for the broker of this machine (as in CI), else with the HTTP API.
    """
    parts = urlsplit(amqp_url)
    user = parts.username or "guest"
    problems = []
    local = parts.hostname in ("127.0.0.1", "localhost", "::1") and (parts.port or 5672) == 5672
    if local and shutil.which("rabbitmqctl"):
        try:
            _rabbitmqctl("add_vhost", vhost)
            _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
            return lambda: _rabbitmqctl("delete_vhost", vhost)
        except (OSError, subprocess.SubprocessError) as error:
            problems.append(f"rabbitmqctl: {error}")
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _rabbitmqctl("delete_vhost", vhost)
    name = quote(vhost, safe="")
    try:
        _management_api(amqp_url, "PUT", f"vhosts/{name}")
        _management_api(
            amqp_url,
            "PUT",
            f"permissions/{name}/{quote(user, safe='')}",
            b'{"configure": ".*", "write": ".*", "read": ".*"}',
        )
        return lambda: _management_api(amqp_url, "DELETE", f"vhosts/{name}")
    except OSError as error:
        problems.append(f"HTTP API: {error}")
    message = f"cannot create a scratch RabbitMQ vhost ({'; '.join(problems)})"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def scratch_vhost(amqp_url: str) -> Iterator[str]:
    """A new vhost on the broker for this test alone, deleted afterwards; its AMQP URL."""
    vhost = f"rr-readme-{secrets.token_hex(4)}"
    delete = _create_vhost(amqp_url, vhost)
    try:
        yield urlunsplit(urlsplit(amqp_url)._replace(path=f"/{quote(vhost, safe='')}"))
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            delete()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


# --- running the commands ---------------------------------------------------------------------


@dataclass
class Background:
    command: Command
    process: asyncio.subprocess.Process
    log: Path
    file: IO[bytes] = field(repr=False)

    def output(self) -> str:
        if not self.file.closed:
            self.file.flush()
        return self.log.read_text(errors="replace")


@dataclass
class Session:
    """Runs the README's commands in one environment and keeps the long-running ones."""

    env: dict[str, str]
    logs: Path
    background: list[Background] = field(default_factory=list)

    def argv(self, command: Command) -> list[str]:
        program = command.argv[0]
        assert program.startswith(".venv/bin/"), program
        return [str(BIN / Path(program).name), *command.argv[1:]]

    async def run(self, command: Command) -> str:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self.argv(command),
            cwd=ROOT,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
        output = stdout.decode(errors="replace")
        expected = EXIT_CODES.get(command.argv[1] if len(command.argv) > 1 else "", 0)
        assert proc.returncode == expected, (
            f"`{command.text}` exited {proc.returncode}, not {expected}:\n{output}"
            f"{self.background_output()}"
        )
        print(f"{time.monotonic() - started:5.1f}s  {command.text}")
        return output

    async def start(self, command: Command) -> Background:
        log = self.logs / f"{len(self.background)}.log"
        file = log.open("wb")
        proc = await asyncio.create_subprocess_exec(
            *self.argv(command), cwd=ROOT, env=self.env, stdout=file, stderr=file
        )
        job = Background(command, proc, log, file)
        self.background.append(job)
        return job

    async def stop_all(self) -> None:
        for job in self.background:
            if job.process.returncode is None:
                job.process.send_signal(signal.SIGTERM)
        for job in self.background:
            try:
                code = await asyncio.wait_for(job.process.wait(), 30)
            except TimeoutError:
                job.process.kill()
                await job.process.wait()
                raise AssertionError(
                    f"`{job.command.text}` did not stop within 30 s of SIGTERM:\n{job.output()}"
                ) from None
            finally:
                job.file.close()
            # uvicorn (the console) shuts down gracefully, then re-raises the signal it caught.
            clean = (0, -signal.SIGTERM) if job.command.argv[1] == "console" else (0,)
            assert code in clean, f"`{job.command.text}` exited {code} on SIGTERM:\n{job.output()}"

    def kill_all(self) -> None:
        for job in self.background:
            if job.process.returncode is None:
                job.process.kill()
            job.file.close()

    def background_output(self) -> str:
        return "".join(
            f"\n--- `{job.command.text}` so far:\n{job.output()}" for job in self.background
        )


async def eventually(
    what: str, check: Callable[[], Awaitable[bool]], path: Session, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in path.background:
            if job.process.returncode is not None:
                raise AssertionError(
                    f"`{job.command.text}` exited {job.process.returncode} while waiting for "
                    f"{what}:\n{job.output()}"
                )
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            if await check():
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}{path.background_output()}")


def _http_ok(url: str) -> Callable[[], Awaitable[bool]]:
    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    async def check() -> bool:
        return await asyncio.to_thread(get)

    return check


def _heartbeat(conn: asyncpg.Connection[Any], name: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(
            await conn.fetchval(
                "SELECT ok FROM rabbitretry.heartbeat WHERE name = $1 AND finished_at IS NOT NULL",
                name,
            )
        )

    return check


async def _works(command: Command, conn: asyncpg.Connection[Any]) -> Callable[[], Awaitable[bool]]:
    """How a long-running command shows that it works."""
    words = command.argv[1:]
    if words[0] == "run":
        port = words[words.index("--metrics-port") + 1] if "--metrics-port" in words else None
        assert port is not None, "the README's `run` shows --metrics-port: probe it"

        async def consuming() -> bool:
            ok = await _http_ok(f"http://127.0.0.1:{port}/metrics")()
            return ok and bool(await conn.fetchval("SELECT to_regclass('points_flow') IS NOT NULL"))

        return consuming  # serving metrics, and setup() has created the example's table
    if words[0] == "console":
        return _http_ok("http://127.0.0.1:8089/")
    if words[0] == "reconcile":
        return _heartbeat(conn, "reconciler")
    if words[:2] == ["alerts", "deliver"]:
        return _heartbeat(conn, "alerts")
    raise AssertionError(f"no check for `{command.text}`: teach this test one")


async def _ledger(conn: asyncpg.Connection[Any], key: str) -> tuple[str, int] | None:
    row = await conn.fetchrow(
        "SELECT status, attempts FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        QUEUE,
        key,
    )
    return None if row is None else (row["status"], row["attempts"])


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_every_command_of_the_readme_works_in_order(
    amqp_url: str, empty_database_url: str, tmp_path: Path
) -> None:
    commands = readme_commands()
    for port in (9464, 8089):  # the README's metrics and console ports
        assert _port_free(port), f"port {port} is taken: the README's commands need it"
    receiver = await WebhookReceiver().start()
    conn: asyncpg.Connection[Any] | None = None
    with scratch_vhost(amqp_url) as vhost_url:
        env = {
            **os.environ,
            "RABBITRETRY_AMQP_URL": vhost_url,
            "RABBITRETRY_DATABASE_URL": empty_database_url,
            "RABBITRETRY_ALERT_WEBHOOK_URL": receiver.url,
            "COLUMNS": "200",
            "NO_COLOR": "1",
        }
        path = Session(env, tmp_path)
        outputs: dict[str, str] = {}
        try:
            for command in commands:
                if command.text in NOT_RUN:
                    continue
                if command.forever:
                    if conn is None:
                        conn = await asyncpg.connect(empty_database_url)
                    await path.start(command)
                    await eventually(f"`{command.text}` to work", await _works(command, conn), path)
                    continue
                outputs[command.text] = await path.run(command)
                if conn is None and "db migrate" in command.text:
                    conn = await asyncpg.connect(empty_database_url)
                if "examples.publish" in command.text:
                    assert conn is not None
                    await _published_orders_settle(conn, path)
                if command.argv[1:3] == ["dead", "ignore"]:
                    assert conn is not None
                    assert await _ledger(conn, DEAD) == ("ignored", 2)
                if command.argv[1:3] == ["dead", "replay"]:
                    assert conn is not None
                    await eventually(
                        "the replayed order to die again",
                        _is(conn, DEAD, ("dead", 2)),
                        path,
                    )
            await path.stop_all()
        finally:
            path.kill_all()
            if conn is not None:
                await conn.close()
            await receiver.close()

    def said(*words: str) -> str:
        return next(outputs[c.text] for c in commands if c.argv[1 : 1 + len(words)] == [*words])

    assert QUEUE in said("status")
    assert "Permanent" in said("dead", "list")
    assert "user 13 is suspended" in said("dead", "show")


def _is(
    conn: asyncpg.Connection[Any], key: str, state: tuple[str, int]
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await _ledger(conn, key) == state

    return check


async def _published_orders_settle(conn: asyncpg.Connection[Any], path: Session) -> None:
    """What the README says publishing does: four orders succeed, the suspended one is dead,
    and each succeeded order is recorded once in points_flow."""

    async def settled() -> bool:
        rows = await conn.fetch(
            "SELECT message_id, status FROM rabbitretry.ledger WHERE queue = $1", QUEUE
        )
        return {r["message_id"]: r["status"] for r in rows} == PUBLISHED

    await eventually("the published orders to settle", settled, path)
    flows = await conn.fetch("SELECT idempotency_key, points FROM points_flow ORDER BY 1")
    assert [(r["idempotency_key"], r["points"]) for r in flows] == [
        (f"{QUEUE}:order-1001-paid", 10),
        (f"{QUEUE}:order-1002-paid", 25),
        (f"{QUEUE}:order-1003-paid", 5),
        (f"{QUEUE}:order-1004-paid", 40),
    ]
