"""The headers of republished copies: broker headers removed, attempts set, every value sendable."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from pamqp import encode

from rabbitretry.message import headers


def test_a_copy_drops_the_broker_headers_and_carries_the_attempts() -> None:
    arrived = {"x-death": [{"count": 1}], "x-first-death-queue": "q", "x-tenant": "acme"}
    assert headers.republished(arrived, 3) == {"x-tenant": "acme", headers.ATTEMPTS: 3}


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        (b"\xff", bytearray(b"\xff")),  # what the client makes of a string that is not UTF-8
        (Decimal("1E+20"), "1E+20"),
        (Decimal("1.5"), Decimal("1.5")),
        (2**70, str(2**70)),
        (float("nan"), "nan"),
        ("\ud800", bytearray(b"\xed\xa0\x80")),
        ([b"x", {"y": b"z"}], [bytearray(b"x"), {"y": bytearray(b"z")}]),
        (datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 1, tzinfo=UTC)),
    ],
)
def test_every_value_is_made_sendable(value: Any, sent: Any) -> None:
    table = headers.publishable({"h": value})
    assert table == {"h": sent}
    encode.field_table(table)  # the client's encoder accepts it


@pytest.mark.parametrize(
    ("value", "attempts"),
    [(3, 3), ("4", 4), ("nonsense", 0), (None, 0), (-2, 0), (2**40, 2**31 - 1), (True, 0)],
)
def test_the_attempts_header_is_bounded(value: Any, attempts: int) -> None:
    assert headers.attempts_of({headers.ATTEMPTS: value} if value is not None else {}) == attempts


def test_x_death_is_read_only_when_well_formed() -> None:
    assert headers.x_death({"x-death": [{"count": 2}, "junk"]}) == [{"count": 2}]
    assert headers.x_death({"x-death": "junk"}) == []


def test_a_header_name_that_was_not_utf8_travels_escaped() -> None:
    table = headers.publishable({"k\udcff": 1})
    assert table == {"k\\udcff": 1}
    encode.field_table(table)


def test_a_copy_drops_cc_and_bcc() -> None:
    arrived = {"CC": ["elsewhere"], "BCC": ["hidden"], "x-tenant": "acme"}
    assert headers.republished(arrived, 1) == {"x-tenant": "acme", headers.ATTEMPTS: 1}


def test_a_message_kept_dead_keeps_its_death_but_not_its_routing_or_delivery_count() -> None:
    arrived = {"x-death": [{"count": 1}], "x-delivery-count": 3, "CC": ["q2"], "x-tenant": "a"}
    assert headers.kept_dead(arrived) == {"x-death": [{"count": 1}], "x-tenant": "a"}


def test_the_death_headers_bound_the_error() -> None:
    death = headers.death(queue="q", reason="r", error_type="E", error="x" * 10_000)
    assert len(death[headers.ERROR]) == headers.ERROR_HEADER_LIMIT
    assert headers.dead_letter({}, 2, queue="q", reason="r", error_type="E", error="e") == {
        headers.ATTEMPTS: 2,
        **headers.death(queue="q", reason="r", error_type="E", error="e"),
    }


def test_copy_properties_escape_text_and_restore_the_timestamp() -> None:
    kept = {"correlation_id": "c\udcff", "type": "t", "timestamp": 1_700_000_000.0}
    assert headers.copy_properties(kept) == {
        "correlation_id": "c\\udcff",
        "type": "t",
        "timestamp": datetime.fromtimestamp(1_700_000_000, tz=UTC),
    }
    assert headers.published_at({}) is None
