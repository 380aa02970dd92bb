"""A PostgreSQL server of the drill's own, so that the database crash stops nobody else's.

The database crash fault stops PostgreSQL in immediate mode (``pg_ctl stop -m immediate``: the
postmaster kills its backends without a checkpoint, as a power cut would for the server
process) and starts it again. A shared server must never suffer that, so the drill runs a
private one: ``initdb`` into a scratch directory, a free port on 127.0.0.1 only, trust
authentication, ``fsync`` and ``synchronous_commit`` on (the crash must be a real one), started
with ``pg_ctl``. PostgreSQL refuses to run as root; as root the drill runs every server command
as the ``postgres`` OS user (``RABBITRETRY_DRILL_PG_USER`` names another) through ``runuser``.

:func:`private_postgres` stops the server and removes its directory on the way out, whatever
happens; a drill killed with SIGKILL cannot, so every drill first stops and removes the private
servers of drills that are no longer running (see :func:`sweep_orphans`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PREFIX = "rabbitretry-drill-pg-"
OWNER_FILE = "drill.pid"  # the pid of the drill that owns the directory
KEPT_FILE = "KEPT"  # left for a post-mortem: the sweep leaves it alone
START_TIMEOUT = 60.0
USER_ENV = "RABBITRETRY_DRILL_PG_USER"
BIN_ENV = "RABBITRETRY_DRILL_PG_BIN"

SETTINGS = """
# rabbitretry drill: a private server, reachable on loopback only.
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
fsync = on
synchronous_commit = on
full_page_writes = on
max_connections = 100
shared_buffers = 32MB
"""


class Unavailable(RuntimeError):
    """No private server can run here (no PostgreSQL binaries, or no user to run them as)."""


def bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: ``RABBITRETRY_DRILL_PG_BIN``, PATH, or Debian's."""
    named = os.environ.get(BIN_ENV)
    candidates = [Path(named)] if named else []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    candidates += [Path(p) for p in debian]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    raise Unavailable(f"no initdb and pg_ctl found (set {BIN_ENV}, or install PostgreSQL)")


def run_as() -> tuple[str, ...]:
    """The command prefix that runs a server command as an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return ()
    user = os.environ.get(USER_ENV, "postgres")
    runuser = shutil.which("runuser")
    if runuser is None:
        raise Unavailable("running as root and runuser is missing: initdb refuses root")
    try:
        import pwd

        pwd.getpwnam(user)
    except KeyError:
        raise Unavailable(
            f"running as root and there is no OS user {user!r} to run PostgreSQL as "
            f"(initdb refuses root; set {USER_ENV})"
        ) from None
    return (runuser, "-u", user, "--")


def available() -> str | None:
    """Why a private server cannot run here, or None when it can."""
    try:
        bin_dir()
        run_as()
    except Unavailable as error:
        return str(error)
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrivatePostgres:
    """One private server: :meth:`create`, then :meth:`crash` / :meth:`start`, :meth:`remove`."""

    def __init__(self, root: Path | None = None) -> None:
        self.bin = bin_dir()
        self.prefix = run_as()
        self.root = root or Path(tempfile.mkdtemp(prefix=PREFIX))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.running = False

    @property
    def kept(self) -> bool:
        return (self.root / KEPT_FILE).exists()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = START_TIMEOUT) -> None:
        result = subprocess.run(
            [*self.prefix, *args],
            timeout=timeout,
            capture_output=True,
            text=True,
            # Its own session: a Ctrl-C in the drill's terminal does not reach the server, whose
            # stop is the drill's to do, in its finally.
            start_new_session=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{Path(args[0]).name} failed ({result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]} (log: {self.log})"
            )

    def create(self) -> None:
        """initdb, then start: the server accepts connections when this returns."""
        (self.root / OWNER_FILE).write_text(f"{os.getpid()}\n")
        if self.prefix:
            user = self.prefix[2]
            shutil.chown(self.root, user)
        self.root.chmod(0o700)
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--locale=C",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(SETTINGS.format(port=self.port, sockets=self.root))
        self.start()

    def start(self) -> None:
        """Start the server and wait until it accepts connections; idempotent."""
        if self.running:
            return
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(int(START_TIMEOUT)),
            "start",
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not _accepts(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private PostgreSQL did not come back (log: {self.log})")
            time.sleep(0.05)
        self.running = True

    def crash(self) -> None:
        """Stop in immediate mode: no checkpoint, unflushed WAL gone, every connection dropped."""
        self.running = False
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "stop", "-m", "immediate")

    def stop(self) -> None:
        """Stop the server if a postmaster runs on the directory; never raises."""
        self.running = False
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "stop", "-m", "immediate")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def keep(self) -> None:
        """Stop the server and leave its directory behind for a post-mortem."""
        self.stop()
        note = "kept for a post-mortem: remove the directory when done\n"
        (self.root / KEPT_FILE).write_text(note)

    def start_command(self) -> str:
        """How to start a kept server by hand (then ``psql -h 127.0.0.1 -p PORT -U postgres``)."""
        runner = " ".join(self.prefix)
        pg_ctl = f"{self.bin / 'pg_ctl'} -D {self.data} -l {self.log} start"
        return f"{runner} {pg_ctl}" if runner else pg_ctl


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans() -> list[Path]:
    """Stop and remove the private servers of drills that died without cleaning up (SIGKILL)."""
    swept = []
    for root in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        if (root / KEPT_FILE).exists():
            continue  # a failed drill's, for a post-mortem: its owner removes it
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        PrivatePostgres(root).remove()
        swept.append(root)
    return swept


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private server; stopped and removed on the way out unless kept."""
    sweep_orphans()
    server = PrivatePostgres()
    try:
        server.create()
        yield server
    finally:
        if not server.kept:
            server.remove()
