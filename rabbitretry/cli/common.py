"""What every command shares: settings, loading consumers and topology files, user errors."""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import wraps
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import asyncpg
import typer
from rich.console import Console

from rabbitretry import logs
from rabbitretry.consumer import Consumer
from rabbitretry.delivery.worker import topology_of
from rabbitretry.errors import ConfigurationError, RabbitRetryError
from rabbitretry.operations import OperationError
from rabbitretry.settings import Settings
from rabbitretry.topology import Topology, load_many

P = ParamSpec("P")
T = TypeVar("T")

MISSING_SCHEMA = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedColumnError,
    asyncpg.UndefinedFunctionError,
    asyncpg.InvalidSchemaNameError,
)

out = Console()
err = Console(stderr=True)


class UserError(RabbitRetryError):
    """A mistake in how a command was called: shown as one line, exit code 2."""


def settings() -> Settings:
    return Settings()


def run_async(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Run an async command and turn expected failures into one readable line."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return asyncio.run(function(*args, **kwargs))
        except (UserError, OperationError) as error:
            err.print(f"[red]error:[/red] {error}", highlight=False)
            raise typer.Exit(2) from None
        except RabbitRetryError as error:
            err.print(f"[red]error:[/red] {error}", highlight=False)
            raise typer.Exit(1) from None
        except MISSING_SCHEMA as error:
            err.print(
                f"[red]error:[/red] the ledger schema is missing or out of date ({error}): "
                "run `rabbitretry db migrate` against RABBITRETRY_DATABASE_URL",
                highlight=False,
            )
            raise typer.Exit(1) from None
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            err.print(f"[red]error:[/red] {type(error).__name__}: {error}", highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

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
        raise UserError(f"{text!r} is not a duration such as 30m, 12h, 7d or 2w")
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
