"""What every command shares: settings, loading consumers and topology files, user errors."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from rabbitretry import db, logs, urls
from rabbitretry.consumer import Consumer, topology_of
from rabbitretry.errors import ConfigurationError, RabbitRetryError
from rabbitretry.ledger import migrations
from rabbitretry.message.literal import visible
from rabbitretry.operations import OperationError
from rabbitretry.settings import AMQP_URL_VARIABLE, DATABASE_URL_VARIABLE, Settings
from rabbitretry.topology import Topology, load_many

P = ParamSpec("P")
T = TypeVar("T")


def literal(value: object) -> Text:
    """A table cell of text from outside (a key, an error, a header): shown as it is. Never
    read as rich markup (``[/x]`` in a key would otherwise fail the command), and control
    characters spelled out, so that no escape sequence reaches the terminal."""
    return Text(visible(str(value)))


def shown(value: object) -> str:
    """Text from outside inside a line that has markup of its own: escaped and visible."""
    return escape(visible(str(value)))


def _stdout() -> Console:
    """Standard output: as wide as the terminal, or when piped wide enough that a table never
    wraps a key (scripts read it line by line); COLUMNS still wins when set."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(width=PIPED_WIDTH)


PIPED_WIDTH = 10_000

out = _stdout()
# Errors are one line each, never wrapped by rich (a terminal still folds them visually).
err = Console(stderr=True, soft_wrap=True)

VerboseOption = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Log at debug level: every step, not only problems."),
]


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json", help="Print JSON on stdout instead of a table (one document, on one line)."
    ),
]


def print_json(value: Any) -> None:
    """``value`` as one line of plain JSON on stdout: no markup, no colour, no wrapping.

    Timestamps are ISO 8601 strings; records and dataclasses become objects."""
    sys.stdout.write(json.dumps(value, default=_json_value, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, db.Record):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, bytes | memoryview):
        return bytes(value).decode("utf-8", "replace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class UserError(RabbitRetryError):
    """A mistake in how a command was called: shown as one line, exit code 2."""


class Config:
    """The ``RABBITRETRY_*`` settings a command reads; each URL is checked when first read,
    so that a command names the variable that is wrong, and only one it uses."""

    def __init__(self, values: Settings) -> None:
        self._values = values

    @property
    def amqp_url(self) -> str:
        urls.check_amqp_urls(self._values.amqp_url, AMQP_URL_VARIABLE)
        return self._values.amqp_url

    @property
    def database_url(self) -> str:
        urls.check_database_url(self._values.database_url, DATABASE_URL_VARIABLE)
        return self._values.database_url

    def database(self, given: str | None) -> str:
        """The ledger database a command acts on: ``--database``, else the variable."""
        if given is None:
            return self.database_url
        urls.check_database_url(given, "--database")
        return given

    def databases(self, given: list[str] | None) -> list[str]:
        """The ledger databases a command acts on: each ``--database``, else the variable."""
        return (
            [self.database(url) for url in dict.fromkeys(given)] if given else [self.database_url]
        )

    @property
    def alert_webhook_url(self) -> str | None:
        return self._values.alert_webhook_url

    @property
    def console_token(self) -> str | None:
        return self._values.console_token

    @property
    def console_user(self) -> str | None:
        return self._values.console_user

    @property
    def console_password(self) -> str | None:
        return self._values.console_password

    @property
    def console_users_file(self) -> str | None:
        return self._values.console_users_file


DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database",
        metavar="URL",
        help="The ledger's PostgreSQL database (default: RABBITRETRY_DATABASE_URL).",
        show_default=False,
    ),
]
DatabasesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--database",
        metavar="URL",
        help="A ledger database to act on; repeat for several (default: RABBITRETRY_DATABASE_URL).",
        show_default=False,
    ),
]


def settings() -> Config:
    return Config(Settings())


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: MESSAGE`` as one line on stderr and exit with ``code``."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def flowing(doc: str | None) -> str | None:
    """A docstring with each paragraph on one line, for the terminal to wrap (typer keeps
    the line breaks of a docstring, which makes ragged help in any other width)."""
    if doc is None:
        return None
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def command(function: Callable[P, T]) -> Callable[P, T]:
    """Mark a command whose help is its docstring: the docstring is reflowed (:func:`flowing`)."""
    function.__doc__ = flowing(function.__doc__)
    return function


EVENT_LOOP_VARIABLE = "RABBITRETRY_EVENT_LOOP"
EVENT_LOOPS = ("asyncio", "uvloop")


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a command runs on: asyncio's (None), or uvloop's with
    ``RABBITRETRY_EVENT_LOOP=uvloop`` (``pip install 'rabbitretry[uvloop]'``). Not the default:
    it spends less CPU per message, but a worker at concurrency 8 groups fewer ledger writes
    per commit on it and runs slower (docs/benchmarks.md, "uvloop")."""
    choice = os.environ.get(EVENT_LOOP_VARIABLE, "").strip().lower() or "asyncio"
    if choice not in EVENT_LOOPS:
        raise UserError(f"{EVENT_LOOP_VARIABLE}={choice!r}: use one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")  # an optional dependency, without types
    except ImportError:
        raise UserError(
            f"{EVENT_LOOP_VARIABLE}=uvloop but uvloop is not installed: "
            "pip install 'rabbitretry[uvloop]'"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_async(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Run an async command and turn expected failures into one readable line (exit 1, or 2
    for a mistake in how it was called); its help is its docstring, reflowed."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                return runner.run(function(*args, **kwargs))
        except (UserError, OperationError) as error:
            fail(str(error), 2)
        except RabbitRetryError as error:
            fail(str(error), 1)
        except db.MISSING_SCHEMA as error:
            fail(
                f"the ledger schema is missing or out of date ({error}): "
                "run `rabbitretry db migrate` against RABBITRETRY_DATABASE_URL",
            )
        except (*db.FAILED, OSError) as error:
            fail(f"{type(error).__name__}: {error}")
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    wrapper.__doc__ = flowing(function.__doc__)
    return wrapper


def load_attribute(
    target: str, shape: str = "MODULE:CLASS (for example examples.points:AwardPoints)"
) -> Any:
    """``package.module:NAME`` → the object it names (a class, a job, a reconciliation)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise UserError(f"{target!r} is not {shape}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise UserError(
            f"cannot import module {module_name!r} ({error}); run from the directory that "
            "contains it, or install it"
        ) from error
    found = getattr(module, attribute, None)
    if found is None:
        raise UserError(f"module {module_name!r} has no attribute {attribute!r}")
    return found


def load_consumer(target: str) -> type[Consumer[Any]]:
    """``package.module:ClassName`` → the Consumer subclass it names."""
    consumer = load_attribute(target)
    if not (isinstance(consumer, type) and issubclass(consumer, Consumer)):
        raise UserError(f"{target} is not a Consumer subclass")
    return consumer


def load_topology(targets: list[str]) -> Topology:
    """Topology from TOML files and/or consumer classes (``MODULE:CLASS``), merged."""
    if not targets:
        raise UserError("name at least one topology file (topology/*.toml) or MODULE:CLASS")
    files = [t for t in targets if t.endswith(".toml")]
    consumers = [load_consumer(t) for t in targets if not t.endswith(".toml")]
    for file in files:
        if not Path(file).is_file():
            raise UserError(f"topology file {file} does not exist")
    try:
        topology = load_many([Path(f) for f in files]) if files else Topology()
        return topology.merge(topology_of(consumers)) if consumers else topology
    except ValueError as error:
        raise ConfigurationError(str(error)) from error


_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``7d``, ``1w``."""
    match = _DURATION.match(text.strip())
    if not match:
        raise UserError(
            f"{text!r} is not a duration: a whole number and a unit (s, m, h, d or w), such as "
            "30m, 12h, 7d or 2w"
        )
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def parse_time(text: str) -> datetime:
    """``30m``, ``2h``, ``7d`` (that long ago) or an ISO timestamp (UTC if no zone is given)."""
    if _DURATION.match(text.strip()):
        return datetime.now(UTC) - parse_duration(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"{text!r} is neither a duration (30m, 2h, 7d) nor a timestamp (2026-01-31T12:00)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def age(moment: datetime | None, now: datetime | None = None) -> str:
    """A short human age: 42s, 5m, 3h, 2d."""
    if moment is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def configure_logging(verbose: bool) -> None:
    """The global ``--log-level`` and ``--log-format`` (rabbitretry/logs.py); -v: debug."""
    logs.configure(verbose)


async def require_migrated(database_url: str) -> None:
    """Fail at start, in one line, when the ledger schema lacks migrations: a server would
    otherwise fail on every request instead."""
    pool = await db.create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            pending = await migrations.pending_migrations(conn)
    finally:
        await pool.close()
    if pending:
        raise UserError(
            f"the ledger schema lacks {', '.join(pending)}: run `rabbitretry db migrate` first"
        )
