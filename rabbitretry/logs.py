"""How the command line logs: the level, and text (the default) or one JSON object per line.

``rabbitretry --log-level LEVEL --log-format json COMMAND`` (or ``RABBITRETRY_LOG_LEVEL`` and
``RABBITRETRY_LOG_FORMAT``) chooses; a command that logs applies the choice with
:func:`configure`. The library itself never configures logging: an application that runs a
:class:`~rabbitretry.Worker` keeps its own handlers, and can use :class:`JsonFormatter` in them.

The AMQP libraries (:data:`QUIET_LIBRARIES`) log a routine loss of the broker connection as a
dozen errors with tracebacks; rabbitretry says it once itself, and demotes their lines to DEBUG
with :func:`demote` (``rabbitretry.amqp`` installs it when it connects).

Log records of the delivery path carry structured fields (``extra``): ``queue``,
``message_id``, ``attempt``, ``outcome``, ``reason``, ``duration`` and ``worker``, as far as
they are known when the line is logged. The JSON format writes them as keys of their own.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TextIO

from rabbitretry.message.literal import visible

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
QUIET_LIBRARIES = ("aio_pika", "aiormq")
"""Chatty below WARNING; their level is not lowered by ``--log-level``."""


class Level(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


class Format(StrEnum):
    text = "text"
    json = "json"


# Attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, then the record's ``extra`` fields, and ``exception`` with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_") and name not in entry:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # ASCII only: a message_id may hold a lone surrogate, which no stream can encode.
        return json.dumps(entry, default=str)


CONTINUATION = "    "


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, one record a line whatever its text holds.

    Keys and error messages come from producers: a control character in the message (an
    escape sequence, a carriage return, a newline) is spelled out as ``[U+001B]``, so it can
    neither steer the terminal nor start a forged record. A traceback keeps its lines, each
    indented by four spaces (its own control characters spelled out), so a line at the first
    column always starts a record.
    """

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = visible(record.getMessage(), keep="")  # a newline, too
        record.asctime = self.formatTime(record, self.datefmt)
        blocks = [self.formatMessage(record)]
        if record.exc_info:
            blocks.append(self.formatException(record.exc_info))
        elif record.exc_text:
            blocks.append(record.exc_text)
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        head, *rest = blocks
        lines = [
            CONTINUATION + visible(line, keep="\n")
            for block in rest
            for line in block.rstrip("\n").split("\n")  # \r, \v and the like: spelled out
        ]
        return "\n".join([head, *lines])


_chosen_level: Level | None = None
_chosen_format: Format = Format.text
_installed: logging.Handler | None = None


def choose(level: Level | None = None, log_format: Format = Format.text) -> None:
    """Remember the command line's choice; :func:`configure` applies it."""
    global _chosen_level, _chosen_format
    _chosen_level = level
    _chosen_format = log_format


def chosen() -> tuple[Level | None, Format]:
    """The command line's choice, to hand to a process of its own."""
    return _chosen_level, _chosen_format


def configure(verbose: bool = False, *, stream: TextIO | None = None) -> logging.Handler:
    """Log to stderr at the chosen level (``verbose``: DEBUG), in the chosen format.

    Replaces the handler an earlier call installed, and nothing else on the root logger.
    """
    global _installed
    if verbose:
        level = logging.DEBUG
    elif _chosen_level is not None:
        level = logging.getLevelNamesMapping()[_chosen_level.upper()]
    else:
        level = logging.INFO
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if _chosen_format is Format.json else TextFormatter())
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(level)
    _installed = handler
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # Python's warnings are printed as text; in JSON, every line of the stream must be JSON.
    logging.captureWarnings(_chosen_format is Format.json)
    return handler


class Demote(logging.Filter):
    """A logger filter that lowers the records ``is_noise`` picks to DEBUG.

    A logger checks its level before its filters, so a demoted record would still reach
    handlers that show everything: it is dropped instead unless its logger is enabled for
    DEBUG, where it is kept, as DEBUG, with its traceback.
    """

    def __init__(self, is_noise: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.is_noise = is_noise

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not self._noise(record):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True

    def _noise(self, record: logging.LogRecord) -> bool:
        try:
            return self.is_noise(record)
        except Exception:  # a filter that raises would lose the record: keep it as it is
            return False


def demote(libraries: Iterable[str], is_noise: Callable[[logging.LogRecord], bool]) -> None:
    """Demote the records ``is_noise`` picks (:class:`Demote`) on every logger of
    ``libraries`` that exists now (a logger's filters see only its own records, not its
    children's), once per logger; loggers the libraries create later are not covered."""
    prefixes = tuple(libraries)
    names = [
        name
        for name in list(logging.root.manager.loggerDict)
        if name in prefixes or name.startswith(tuple(f"{p}." for p in prefixes))
    ]
    for name in dict.fromkeys([*prefixes, *names]):
        logger = logging.getLogger(name)
        if not any(isinstance(f, Demote) and f.is_noise is is_noise for f in logger.filters):
            logger.addFilter(Demote(is_noise))
