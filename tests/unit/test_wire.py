"""What AMQP can carry: the reasons given, and agreement with the encoder aio-pika uses."""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

import aio_pika
import pytest
from aiormq.abc import ChannelFrame
from pamqp import commands
from pamqp.header import ContentHeader

from rabbitretry.message.wire import why_unencodable


def check(
    *,
    exchange: str = "",
    routing_key: str = "orders",
    message_id: str = "order-1-paid",
    headers: dict[Any, Any] | None = None,
    properties: dict[str, Any] | None = None,
) -> str | None:
    return why_unencodable(
        exchange=exchange,
        routing_key=routing_key,
        message_id=message_id,
        headers=headers,
        properties=properties,
    )


def test_an_ordinary_message_is_encodable() -> None:
    headers = {
        "x-rabbitretry-attempts": 3,
        "tenant": "acme",
        "nul": "a\x00b",
        "ratio": 0.25,
        "flag": True,
        "nothing": None,
        "when": datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC),
        "raw": bytearray(b"\xff"),
        "price": decimal.Decimal("12.50"),
        "nested": {"list": [1, "two", {"three": [2**63 - 1, -(2**63)]}]},
        "é" * 64: "a name of exactly 128 bytes",
    }
    assert check(headers=headers, properties={"content_type": "application/json"}) is None
    assert check(exchange="amq.topic", message_id="m" * 255, routing_key="r" * 255) is None


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"message_id": "x" * 300}, "message_id is 300 bytes; AMQP allows at most 255"),
        ({"message_id": "é" * 128}, "message_id is 256 bytes; AMQP allows at most 255"),
        ({"routing_key": "r" * 256}, "routing key is 256 bytes; AMQP allows at most 255"),
        (
            {"properties": {"correlation_id": "c" * 256}},
            "correlation_id is 256 bytes; AMQP allows at most 255",
        ),
        (
            {"message_id": "bad\ud800"},
            "message_id 'bad\\ud800' is not valid Unicode text (it holds a lone surrogate)",
        ),
        (
            {"headers": {"n": 2**63}},
            "header 'n' holds the integer 9223372036854775808, which does not fit in the "
            "64-bit signed integer AMQP allows",
        ),
        (
            {"headers": {"n": -(2**63) - 1}},
            "header 'n' holds the integer -9223372036854775809, which does not fit in the "
            "64-bit signed integer AMQP allows",
        ),
        (
            {"headers": {"a": {"b": [1, float("nan")]}}},
            "header 'a.b[1]' is NaN: RabbitMQ closes the publishing connection on a NaN or "
            "infinite number",
        ),
        (
            {"headers": {"x": -math.inf}},
            "header 'x' is infinite: RabbitMQ closes the publishing connection on a NaN or "
            "infinite number",
        ),
        (
            {"headers": {"sig": b"\x00\x01"}},
            "header 'sig' holds a value of type bytes (b'\\x00\\x01'), which AMQP cannot carry "
            "(use text, a number, a boolean, a timestamp, a list or a table)",
        ),
        (
            {"headers": {"bad\udcff": 1}},
            "header name 'bad\\udcff' is not valid Unicode text (it holds a lone surrogate)",
        ),
        ({"headers": {1: "one"}}, "header name 1 is not text"),
    ],
)
def test_the_reason_says_what_is_wrong(message: dict[str, Any], reason: str) -> None:
    assert check(**message) == reason


@pytest.mark.parametrize(
    "value",
    [{1, 2}, (1, 2), datetime.date(2024, 1, 1), object(), b"", decimal.Decimal("NaN")],
)
def test_values_the_encoder_has_no_type_for_are_refused(value: Any) -> None:
    reason = check(headers={"h": value})
    assert reason is not None and reason.startswith("header 'h' ")


def test_decimals_beyond_amqps_decimal_are_refused() -> None:
    assert check(headers={"d": decimal.Decimal("2147483647")}) is None
    assert check(headers={"d": decimal.Decimal("1E+3")}) is None
    for too_much in ("2147483648", "0.12345678901", "1E+10"):
        assert check(headers={"d": decimal.Decimal(too_much)}) is not None


@pytest.mark.parametrize(
    "exchange", ["orders!", "bestellungen-ü", "e" * 128, "tab\there"], ids=repr
)
def test_exchange_names_the_client_cannot_send_are_refused(exchange: str) -> None:
    reason = check(exchange=exchange)
    assert reason is not None and reason.startswith("exchange name ")


# Every case above, checked against what aio-pika's encoder (pamqp, through aiormq's frame
# marshalling) does with it, so that the check cannot drift from the encoder unnoticed.
ENCODER_CASES: list[dict[str, Any]] = [
    {},
    {"message_id": "m" * 255},
    {"message_id": "m" * 256},
    {"message_id": "é" * 128},
    {"routing_key": "r" * 256},
    {"exchange": "amq.direct"},
    {"exchange": "orders!"},
    {"exchange": "e" * 128},
    {"properties": {"content_type": "c" * 256}},
    {"properties": {"app_id": "a" * 255}},
    {"headers": {"n": 2**63 - 1}},
    {"headers": {"n": 2**63}},
    {"headers": {"n": [2**70]}},
    {"headers": {"n": {"deep": -(2**63) - 1}}},
    {"headers": {"b": b"bytes"}},
    {"headers": {"b": bytearray(b"bytes")}},
    {"headers": {"s": {1, 2}}},
    {"headers": {"t": (1, 2)}},
    {"headers": {"d": decimal.Decimal("3.25")}},
    {"headers": {"d": decimal.Decimal("2147483648")}},
    {"headers": {"d": decimal.Decimal("Infinity")}},
    {"headers": {"when": datetime.datetime(2024, 5, 1)}},
    {"headers": {"day": datetime.date(2024, 5, 1)}},
    {"headers": {"text": "a\x00b", "none": None, "yes": False, "f": 1.5}},
    {"headers": {"bad": "x\udcff"}},
    {"headers": {"x\udcff": "bad name"}},
]


def encodes(message: dict[str, Any]) -> bool:
    """Whether aiormq could marshal the publish frames of this message."""
    try:
        body = aio_pika.Message(
            b"{}",
            message_id=message.get("message_id", "order-1-paid"),
            headers=message.get("headers"),
            **message.get("properties", {}),
        )
        frames = [
            commands.Basic.Publish(
                exchange=message.get("exchange", ""),
                routing_key=message.get("routing_key", "orders"),
                mandatory=True,
            ),
            ContentHeader(properties=body.properties, body_size=len(body.body)),
        ]
        ChannelFrame.marshall(channel_number=1, frames=frames)
    except (TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("message", ENCODER_CASES, ids=repr)
def test_the_check_agrees_with_the_encoder(message: dict[str, Any]) -> None:
    assert (check(**message) is None) == encodes(message)


def test_what_the_encoder_takes_but_the_check_refuses() -> None:
    """NaN and infinity encode, but the broker then closes the whole connection."""
    for value in (math.nan, math.inf, -math.inf):
        assert encodes({"headers": {"x": value}})
        assert check(headers={"x": value}) is not None


def test_a_long_header_name_passes_as_the_encoder_cuts_it_to_128_bytes() -> None:
    assert encodes({"headers": {"k" * 200: 1}})
    assert check(headers={"k" * 200: 1}) is None
