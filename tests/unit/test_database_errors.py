"""What a database error means: an outage ("not now"), a lost race, or this request's fault.

Errors are built from their SQLSTATE the way the driver builds the server's own, so each case
is the class asyncpg raises for that code. An outage closes the worker's ledger gate
(deliveries pause, nothing charged); a lost race is retried; anything else is the content's
or the code's failure.
"""

from __future__ import annotations

import asyncpg
import pytest

from rabbitretry import db


def server_error(sqlstate: str, message: str = "", function: str = "") -> BaseException:
    """The exception the driver raises for an ErrorResponse with this SQLSTATE."""
    fields = {"C": sqlstate, "M": message or f"error {sqlstate}", "S": "ERROR"}
    if function:
        fields["R"] = function
    return asyncpg.PostgresError.new(fields)


OUTAGES = {
    "57P03": ("the database system is starting up", "", "starting up or recovering"),
    "57P03-standby": (
        "the database system is not accepting connections (Hot standby mode is disabled.)",
        "",
        "starting up or recovering",
    ),
    "53300": ("sorry, too many clients already", "", "out of connections"),
    "53100": ("could not extend file: No space left on device", "", "(a full disk)"),
    "53200": ("out of memory", "", "(no memory)"),
    "57P01": ("terminating connection due to administrator command", "", "shutting down"),
    "57P02": ("terminating connection because of crash of another server process", "", "shut"),
    "25006": ("cannot execute INSERT in a read-only transaction", "", "read-only"),
    "55000": (
        'database "shop" is not currently accepting connections',
        "CheckMyDatabase",
        "not accepting connections",
    ),
    "08006": ("connection failure", "", "unreachable"),
}


@pytest.mark.parametrize("case", OUTAGES)
def test_a_refusal_that_means_not_now_is_an_outage(case: str) -> None:
    message, function, kind = OUTAGES[case]
    error = server_error(case.split("-")[0], message, function)
    assert db.is_outage(error)
    assert db.is_unavailable(error)  # the database itself, not a race: the gate closes
    assert not db.is_lost_race(error)
    assert not db.is_content_error(error)
    assert not db.fails_the_transaction(error)  # never a handler transaction's own failure
    assert kind in db.outage_kind(error), db.outage_kind(error)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    ],
    ids=["refused", "timeout", "closed", "lost"],
)
def test_a_lost_or_refused_connection_is_an_outage(error: BaseException) -> None:
    assert db.is_outage(error) and db.is_unavailable(error)
    assert db.outage_kind(error) == "unreachable"


# A statement that lost to another transaction: the same request wins on a second try. The
# ledger's own statements requeue it, nothing charged; a handler's transaction records it as
# the attempt's failure and retries it. Either way the database is not down.
LOST_RACES = {
    "40001": "could not serialize access due to read/write dependencies among transactions",
    "40P01": "deadlock detected",
}


@pytest.mark.parametrize("sqlstate", LOST_RACES)
def test_a_lost_race_is_retried_and_not_an_outage_of_the_database(sqlstate: str) -> None:
    error = server_error(sqlstate, LOST_RACES[sqlstate])
    assert db.is_lost_race(error)
    assert not db.is_unavailable(error)
    assert db.fails_the_transaction(error)
    assert not db.is_content_error(error)


# What the same request meets every time: this row's data (content) or the code (a bug).
NOT_OUTAGES = {
    "23505": ("duplicate key value violates unique constraint", "", True),
    "23502": ("null value in column violates not-null constraint", "", True),
    "22P02": ("invalid input syntax for type integer", "", True),
    "22021": ("invalid byte sequence for encoding UTF8: 0x00", "", True),
    "54000": ("index row size exceeds btree maximum", "", True),
    "42601": ("syntax error at or near", "", False),
    "42P01": ('relation "ledger" does not exist', "", False),
    "42501": ("permission denied for table ledger", "", False),
    "0A000": ("cannot set transaction read-write mode during recovery", "", False),
    "XX000": ("internal error", "", False),
    "55P03": ("canceling statement due to lock timeout", "", False),
    # 55000 elsewhere than the connection check is a request made in the wrong state.
    "55000": ("cannot alter type of a column used by a view", "ATExecAlterColumnType", False),
    "25P02": ("current transaction is aborted", "", False),
}


@pytest.mark.parametrize("sqlstate", NOT_OUTAGES)
def test_content_and_bugs_are_not_outages(sqlstate: str) -> None:
    message, function, content = NOT_OUTAGES[sqlstate]
    error = server_error(sqlstate, message, function)
    assert not db.is_outage(error)
    assert not db.is_unavailable(error)
    assert not db.is_lost_race(error)
    assert db.is_content_error(error) is content
    assert db.fails_the_transaction(error)


def test_a_value_the_driver_cannot_encode_is_content() -> None:
    error = asyncpg.exceptions._base.DataError("invalid input for query argument $1")
    assert db.is_content_error(error) and not db.is_outage(error)
