"""The faults a drill injects, and the promise to undo every one of them.

Connections are cut, or stalled (kept open, no byte through), through TCP proxies of the
drill's own on loopback (the worker reaches RabbitMQ and PostgreSQL only through them, the
reconciler RabbitMQ). The
broker restart stops and starts RabbitMQ's application with ``rabbitmqctl``: that affects
everyone on the broker, so run the drill alone on a shared one (see docs/drills.md). The
database crash stops the drill's private PostgreSQL server in immediate mode and starts it
again (:mod:`drills.private_postgres`): it never touches a shared server.
:meth:`Faults.restore` puts everything back and is safe to call at any time, any number of
times.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from drills.plan import Fault
from drills.private_postgres import PrivatePostgres
from drills.supervisor import Supervisor
from rabbitretry import db
from tests.proxy import Proxy

CUT_SECONDS = 3.0  # how long a cut connection stays refused
BROKER_DOWN_SECONDS = 2.0  # between stop_app and start_app
BROKER_START_TIMEOUT = 120.0
DATABASE_DOWN_SECONDS = 2.0  # between the immediate stop and the start
# A silent database, for longer than a worker waits for a ledger statement's answer: the
# worker must take it for an outage, pause, and resume by itself.
STALL_SECONDS = db.SILENT_AFTER + 2.0
# The heartbeat (seconds) the drill's worker and reconciler ask for on their way through the
# broker proxy, and a silent broker for longer than its verdict (no frame for
# 3 * (heartbeat + 1) s, checked every heartbeat): both must take their connections for lost,
# reconnect, and go on by themselves.
BROKER_HEARTBEAT = 2
BROKER_STALL_SECONDS = 3 * (BROKER_HEARTBEAT + 1) + BROKER_HEARTBEAT + 2.0


@dataclass
class Faults:
    supervisor: Supervisor
    broker_proxy: Proxy
    database_proxy: Proxy
    broker_host: str
    broker_port: int
    say: Callable[[str], None]
    database_server: PrivatePostgres | None = None
    """The drill's private PostgreSQL, which ``crash-database`` stops (None: no such fault)."""
    broker_stopped: bool = field(default=False, init=False)
    done: list[str] = field(default_factory=list, init=False)
    database_outages: list[float] = field(default_factory=list, init=False)
    """Seconds from each immediate stop until the server accepted connections again."""

    async def inject(self, fault: Fault) -> None:
        if fault == "kill":
            pid = await self.supervisor.kill()
            self.say(f"SIGKILL worker pid {pid}")
        elif fault == "cut-broker":
            await self._cut(self.broker_proxy, "broker")
        elif fault == "cut-database":
            await self._cut(self.database_proxy, "database")
        elif fault == "stall-database":
            await self._stall(self.database_proxy, "database", STALL_SECONDS)
        elif fault == "stall-broker":
            await self._stall(self.broker_proxy, "broker", BROKER_STALL_SECONDS)
        elif fault == "restart-broker":
            await self._restart_broker()
        elif fault == "crash-database":
            await self._crash_database()
        self.done.append(fault)

    async def _cut(self, proxy: Proxy, what: str) -> None:
        self.say(f"cut the {what} connection for {CUT_SECONDS:.0f} s")
        await proxy.cut(refuse=True)
        try:
            await asyncio.sleep(CUT_SECONDS)
        finally:
            proxy.restore()

    async def _stall(self, proxy: Proxy, what: str, seconds: float) -> None:
        self.say(f"the {what} stops answering for {seconds:.0f} s (connections kept)")
        proxy.stall()
        try:
            await asyncio.sleep(seconds)
        finally:
            proxy.restore()

    async def _restart_broker(self) -> None:
        self.say("rabbitmqctl stop_app")
        self.broker_stopped = True
        try:
            await asyncio.to_thread(_rabbitmqctl, "stop_app")
            await asyncio.sleep(BROKER_DOWN_SECONDS)
        finally:
            # Blocking on purpose: runs to the end even when the drill is being cancelled.
            self.start_broker()
        self.say("rabbitmqctl start_app: the broker answers again")

    async def _crash_database(self) -> None:
        server = self.database_server
        if server is None:
            raise RuntimeError("crash-database needs the drill's private PostgreSQL server")
        self.say(f"PostgreSQL stopped in immediate mode (port {server.port})")
        stopped = time.monotonic()
        try:
            await asyncio.to_thread(server.crash)
            await asyncio.sleep(DATABASE_DOWN_SECONDS)
        finally:
            # Blocking on purpose: runs to the end even when the drill is being cancelled.
            server.start()
        self.database_outages.append(time.monotonic() - stopped)
        self.say(
            f"PostgreSQL started: it accepts connections again after "
            f"{self.database_outages[-1]:.1f} s"
        )

    def start_broker(self) -> None:
        """start_app, then wait until the broker answers on its port; idempotent."""
        if not self.broker_stopped:
            return
        _rabbitmqctl("start_app")
        _rabbitmqctl("await_startup")
        deadline = time.monotonic() + BROKER_START_TIMEOUT
        while not _port_open(self.broker_host, self.broker_port):
            if time.monotonic() > deadline:
                raise RuntimeError("RabbitMQ did not come back after start_app")
            time.sleep(0.2)
        self.broker_stopped = False

    def restore(self) -> None:
        """Undo whatever is still in effect: proxies open, broker and database running."""
        self.broker_proxy.restore()
        self.database_proxy.restore()
        try:
            self.start_broker()
        finally:
            if self.database_server is not None:
                self.database_server.start()


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", *args],
        check=True,
        timeout=BROKER_START_TIMEOUT,
        stdout=subprocess.DEVNULL,
    )


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), 1):
            return True
    except OSError:
        return False
