"""Logging options, the JSON format, ``--version``, ``python -m rabbitretry`` and completion."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import rabbitretry
from rabbitretry import logs
from rabbitretry.cli import app


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    if logs._installed is not None:
        root.removeHandler(logs._installed)
        logs._installed = None
    root.handlers[:] = handlers
    root.setLevel(level)
    logs.choose()
    logging.captureWarnings(False)


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": "rabbitretry.worker", "levelno": logging.ERROR, "levelname": "ERROR"}
        | {"msg": message, "args": args, "created": 0.5}
        | extra
    )


def test_json_lines_carry_the_record_and_its_delivery_fields() -> None:
    line = logs.JsonFormatter().format(
        record(
            "%s: dead (%s)",
            "q/m-1",
            "permanent-error",
            queue="q",
            message_id="m-1",
            attempt=2,
            outcome="dead",
            reason="permanent-error",
            duration=0.25,
            worker="host:1:0",
        )
    )
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "1970-01-01T00:00:00.500+00:00",
        "level": "ERROR",
        "logger": "rabbitretry.worker",
        "message": "q/m-1: dead (permanent-error)",
        "queue": "q",
        "message_id": "m-1",
        "attempt": 2,
        "outcome": "dead",
        "reason": "permanent-error",
        "duration": 0.25,
        "worker": "host:1:0",
    }


def test_json_lines_hold_any_text_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    line = logs.JsonFormatter().format(
        record("odd id %r", "a\x00\ud800", message_id="a\x00\ud800\n", exc_info=exc_info)
    )
    assert line.isascii() and "\n" not in line  # a lone surrogate cannot break the stream
    entry = json.loads(line)
    assert entry["message_id"] == "a\x00\ud800\n"
    assert entry["exception"].startswith("Traceback") and "ValueError: boom" in entry["exception"]


FORGED = "\n2026-12-04 18:00:00,000 INFO    rabbitretry.worker: all is well"


def test_text_lines_show_control_characters_and_cannot_be_forged() -> None:
    # A producer's key and error text reach the log: neither may clear the terminal, recolour
    # it, or start a line that reads as a record of its own.
    stream = io.StringIO()
    logs.configure(stream=stream)
    try:
        raise ValueError(f"boom\x1b[31m{FORGED}")
    except ValueError:
        logging.getLogger("rabbitretry.test").exception(
            "orders/%s: dead", "k\x1b[2J\r\u202e" + FORGED
        )
    text = stream.getvalue()
    lines = text.splitlines()
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    first = "orders/k[U+001B][2J[U+000D][U+202E][U+000A]2026-12-04 18:00:00,000 INFO"
    assert first in lines[0] and lines[0].endswith("rabbitretry.worker: all is well: dead")
    # The traceback follows, indented: a line at the first column always starts a record.
    assert [line for line in lines if not line[:1].isspace()] == lines[:1]
    assert lines[1].strip() == "Traceback (most recent call last):"
    assert "ValueError: boom[U+001B][31m" in text
    assert "    2026-12-04 18:00:00,000 INFO    rabbitretry.worker: all is well" in lines


def test_configure_applies_the_chosen_level_and_format() -> None:
    stream = io.StringIO()
    logs.choose(logs.Level.warning, logs.Format.json)
    logs.configure(stream=stream)
    log = logging.getLogger("rabbitretry.test")
    log.info("not shown")
    log.warning("shown", extra={"queue": "q"})
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["queue"] == "q"
    assert logging.getLogger("aiormq").getEffectiveLevel() == logging.WARNING

    stream = io.StringIO()
    logs.choose()
    logs.configure(verbose=True, stream=stream)  # replaces the handler: one line, not two
    log.debug("debug, as text")
    assert stream.getvalue().endswith("DEBUG   rabbitretry.test: debug, as text\n")
    assert logs._installed is not None
    assert logging.getLogger().handlers.count(logs._installed) == 1


def test_the_global_options_and_their_variables() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["--log-level", "ERROR", "--log-format", "json", "db", "--help"])
    assert result.exit_code == 0, result.output
    assert (logs._chosen_level, logs._chosen_format) == (logs.Level.error, logs.Format.json)

    env = {"RABBITRETRY_LOG_LEVEL": "debug", "RABBITRETRY_LOG_FORMAT": "json"}
    result = runner.invoke(app, ["db", "--help"], env=env)
    assert result.exit_code == 0, result.output
    assert (logs._chosen_level, logs._chosen_format) == (logs.Level.debug, logs.Format.json)

    result = runner.invoke(app, ["--log-format", "xml", "db", "--help"])
    assert result.exit_code == 2


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert (result.exit_code, result.output) == (0, f"rabbitretry {rabbitretry.__version__}\n")


def test_python_dash_m_is_the_same_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rabbitretry", "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, f"rabbitretry {rabbitretry.__version__}\n")
    done = subprocess.run([sys.executable, "-m", "rabbitretry"], capture_output=True, text=True)
    assert "Usage: rabbitretry" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("shell", "marker"), [("bash", "complete -o default"), ("zsh", "#compdef rabbitretry")]
)
def test_shell_completion_scripts(shell: str, marker: str) -> None:
    # Typer detects the shell it runs under, when the module is imported, unless told not to.
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rabbitretry", "--show-completion", shell],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout and "_RABBITRETRY_COMPLETE" in done.stdout


def test_completion_completes_commands() -> None:
    env = {
        "_RABBITRETRY_COMPLETE": "complete_bash",
        "COMP_WORDS": "rabbitretry dead rep",
        "COMP_CWORD": "2",
    }
    result = CliRunner().invoke(app, [], env=env, prog_name="rabbitretry")
    assert result.output.split() == ["replay"]


# --- demoting a library's noise --------------------------------------------------------------


def noisy(record: logging.LogRecord) -> bool:
    return "noise" in str(record.msg)


@pytest.fixture
def library() -> Iterator[logging.Logger]:
    """A logger tree of its own (``fake_library`` and a child), its filters removed after."""
    parent, child = logging.getLogger("fake_library"), logging.getLogger("fake_library.io")
    yield child
    for logger in (parent, child):
        logger.filters.clear()
        logger.setLevel(logging.NOTSET)


def test_a_demoted_record_is_debug_where_debug_is_shown(
    library: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    logs.demote(["fake_library"], noisy)
    logs.demote(["fake_library"], noisy)  # installed once
    assert len(library.filters) == 1
    caplog.set_level(logging.DEBUG)
    try:
        raise ConnectionError("gone")
    except ConnectionError:
        library.exception("noise: the connection closed")
    library.error("a real error")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "noise: the connection closed"),
        ("ERROR", "a real error"),
    ]
    assert caplog.records[0].exc_info is not None  # the traceback is kept for debugging


def test_a_demoted_record_is_dropped_where_debug_is_not_shown(
    library: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    logs.demote(["fake_library"], noisy)
    caplog.set_level(logging.DEBUG)  # the handler shows everything it is given
    library.setLevel(logging.WARNING)  # as logs.configure() sets the AMQP libraries
    library.error("noise: the connection closed")
    library.warning("a real warning")
    assert [r.getMessage() for r in caplog.records] == ["a real warning"]


def test_a_predicate_that_fails_keeps_the_record(
    library: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(record: logging.LogRecord) -> bool:
        raise AttributeError("a repr that fails")

    logs.demote(["fake_library"], broken)
    library.error("noise, kept as it is")
    assert [r.levelname for r in caplog.records] == ["ERROR"]
