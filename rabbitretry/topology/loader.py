"""Topologies from TOML files.

A file lists ``[[exchanges]]`` and ``[[queues]]`` (see
:class:`~rabbitretry.topology.model.WorkQueue`)::

    [[exchanges]]
    name = "orders"
    type = "topic"

    [[queues]]
    name = "points.award"
    type = "quorum"
    delivery_limit = 1000   # quorum only; the default. "broker-default": no x-delivery-limit
    bindings = [{ exchange = "orders", routing_key = "order.paid" }]

:func:`load_many` reads several files (or directories of ``*.toml`` files) as one topology, so a
queue in one file may bind to an exchange declared in another. Every problem is a
:class:`ConfigurationError` that names the file and says what is wrong in one paragraph.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rabbitretry.errors import ConfigurationError
from rabbitretry.topology.model import Exchange, Topology, WorkQueue

PathLike = str | Path


class _FileContents(BaseModel):
    """One file's entries, each valid on its own; consistency is checked on the whole set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exchanges: list[Exchange] = []
    queues: list[WorkQueue] = []


def load_toml(path: PathLike) -> Topology:
    """The topology in one TOML file."""
    return load_many([path])


def load_many(paths: Iterable[PathLike]) -> Topology:
    """The topologies of several files (or directories of ``*.toml``), merged into one.

    An exchange or queue defined in more than one file must be defined identically.
    """
    files = _expand(paths)
    contents = {path: _read(path) for path in files}
    exchanges = _merge_exchanges(contents)
    topology = Topology()
    for path, content in contents.items():
        part = _build(path, exchanges.exchanges, content.queues)
        try:
            topology = topology.merge(part)
        except (ValueError, ValidationError) as error:
            raise _problem(path, error, "conflicts with the files before it") from None
    return topology


def _expand(paths: Iterable[PathLike]) -> list[Path]:
    files: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found = sorted(entry.glob("*.toml"))
            if not found:
                raise ConfigurationError(f"{entry}: no *.toml topology files in this directory")
            files.extend(found)
        else:
            files.append(entry)
    if not files:
        raise ConfigurationError("no topology files given")
    return files


def _read(path: Path) -> _FileContents:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigurationError(
            f"{path}: cannot read topology file: {error.strerror or error}"
        ) from None
    except UnicodeDecodeError as error:
        raise ConfigurationError(f"{path}: not a UTF-8 text file: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"{path}: not valid TOML: {error}") from None
    try:
        return _FileContents.model_validate(data)
    except ValidationError as error:
        raise _problem(path, error, "invalid topology", data) from None


def _merge_exchanges(contents: dict[Path, _FileContents]) -> Topology:
    merged = Topology()
    for path, content in contents.items():
        try:
            merged = merged.merge(Topology(exchanges=content.exchanges))
        except (ValueError, ValidationError) as error:
            raise _problem(path, error, "conflicts with the files before it") from None
    return merged


def _build(path: Path, exchanges: Sequence[Exchange], queues: Sequence[WorkQueue]) -> Topology:
    try:
        return Topology(exchanges=list(exchanges), queues=list(queues))
    except ValidationError as error:
        raise _problem(path, error, "invalid topology") from None


def _problem(path: Path, error: Exception, what: str, data: Any = None) -> ConfigurationError:
    if isinstance(error, ValidationError):
        details = "; ".join(_describe(item, data) for item in error.errors())
    else:
        details = str(error)
    return ConfigurationError(f"{path}: {what}: {details}")


def _describe(item: Any, data: Any) -> str:
    """One pydantic error as ``queues[0] ("points.award").max_delay: message (got -1)``."""
    message = str(item["msg"]).removeprefix("Value error, ")
    location = _location(tuple(item["loc"]), data)
    shown = f"{location}: {message}" if location else message
    if item["type"] not in ("value_error", "missing", "extra_forbidden") and location:
        shown += f" (got {item['input']!r})"
    return shown


def _location(loc: tuple[Any, ...], data: Any) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
            data = data[part] if isinstance(data, list) and part < len(data) else None
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                text += f" ({data['name']!r})"
            continue
        text += f".{part}" if text else str(part)
        data = data.get(part) if isinstance(data, dict) else None
    return text
