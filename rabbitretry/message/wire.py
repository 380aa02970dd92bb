"""What an AMQP 0-9-1 publish can carry: one pure check, run before a message is sent.

A message that cannot be encoded is a fault of its content, not of the broker: publishing it
again cannot help, so a caller that knows this up front fails it at once instead of retrying.
The limits are those of the protocol and of pamqp, the encoder under aio-pika:

* short strings (``message_id`` and the other text properties, the routing key) hold at most
  255 bytes of UTF-8; an exchange name at most 127 characters from a small alphabet;
* header names are text. pamqp cuts a name over 128 bytes down to 128, with a warning. That
  alters the message but loses nothing, so it is let through: a worker must still be able to
  republish (retry, dead-letter) a message that another client sent with such a name;
* header values are booleans, 64-bit signed integers, finite floats, decimals, text,
  timestamps, ``bytearray``, ``None``, and lists and tables of those. ``bytes`` and other
  types are refused by the encoder; a NaN or an infinity is encoded, but RabbitMQ answers
  it by closing the publisher's whole *connection* (541 INTERNAL_ERROR), so it is refused here;
* the properties and headers together must fit in one frame of the connection (its
  ``frame_max``): that depends on the connection, so the confirming publisher checks it
  (:mod:`rabbitretry.amqp.frame_size`), and refuses the message the same way.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
import time
from collections.abc import Mapping
from typing import Any

SHORT_STRING_BYTES = 255
EXCHANGE_NAME_CHARACTERS = 127
EXCHANGE_NAME = re.compile(r"[a-zA-Z0-9\-_.:@#,/+ ]*")  # pamqp's exchange-name domain
INT64 = range(-(2**63), 2**63)
SHOWN = 60  # characters of an offending value quoted in a reason


def why_unencodable(
    *,
    exchange: str,
    routing_key: str,
    message_id: str,
    headers: Mapping[str, Any] | None = None,
    properties: Mapping[str, Any] | None = None,
) -> str | None:
    """Why this message cannot be published as AMQP, as one sentence; None if it can.

    ``properties`` are the other basic properties (``content_type``, ``correlation_id``,
    ...); the body is not checked (any bytes can be sent).
    """
    if len(exchange) > EXCHANGE_NAME_CHARACTERS or not EXCHANGE_NAME.fullmatch(exchange):
        return (
            f"exchange name {_shown(exchange)} is not one AMQP clients can send: at most "
            f"{EXCHANGE_NAME_CHARACTERS} characters of letters, digits, spaces and -_.:@#,/+"
        )
    texts = {"routing key": routing_key, "message_id": message_id}
    texts |= {name: value for name, value in (properties or {}).items() if isinstance(value, str)}
    for name, text in texts.items():
        problem = _short_string_problem(name, text)
        if problem is not None:
            return problem
    return _table_problem("", headers or {})


def _short_string_problem(name: str, text: str) -> str | None:
    size = _utf8_size(text)
    if size is None:
        return f"{name} {_shown(text)} is not valid Unicode text (it holds a lone surrogate)"
    if size > SHORT_STRING_BYTES:
        return f"{name} is {size} bytes; AMQP allows at most {SHORT_STRING_BYTES}"
    return None


def _table_problem(path: str, table: Mapping[Any, Any]) -> str | None:
    """The first problem among a table's names and values (``path`` is where it sits)."""
    for key, value in table.items():
        name = f"{path}.{key}" if path else str(key)
        problem = _name_problem(key) or _value_problem(name, value)
        if problem is not None:
            return problem
    return None


def _name_problem(key: object) -> str | None:
    if not isinstance(key, str):
        return f"header name {_shown(key)} is not text"
    if _utf8_size(key) is None:
        return f"header name {_shown(key)} is not valid Unicode text (it holds a lone surrogate)"
    return None


def _value_problem(path: str, value: Any) -> str | None:
    """The problem with the header at ``path`` (``a``, ``a.b``, ``a[2]``) holding ``value``."""
    if isinstance(value, dict):  # what pamqp encodes as a table (not any Mapping)
        return _table_problem(path, value)
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = _value_problem(f"{path}[{index}]", item)
            if problem is not None:
                return problem
        return None
    return _scalar_problem(path, value)


def _scalar_problem(path: str, value: Any) -> str | None:
    if value is None or isinstance(value, bool | bytearray | datetime.datetime | time.struct_time):
        return None
    if isinstance(value, int):
        if value not in INT64:
            return (
                f"header {path!r} holds the integer {_shown(value)}, which does not fit in "
                "the 64-bit signed integer AMQP allows"
            )
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return (
                f"header {path!r} is {'NaN' if math.isnan(value) else 'infinite'}: RabbitMQ "
                "closes the publishing connection on a NaN or infinite number"
            )
        return None
    if isinstance(value, decimal.Decimal):
        return _decimal_problem(path, value)
    if isinstance(value, str):
        if _utf8_size(value) is None:
            return f"header {path!r} is not valid Unicode text (it holds a lone surrogate)"
        return None
    return (
        f"header {path!r} holds a value of type {type(value).__name__} ({_shown(value)}), "
        "which AMQP cannot carry (use text, a number, a boolean, a timestamp, a list or a table)"
    )


def fits_amqp_decimal(value: decimal.Decimal) -> bool:
    """True when ``value`` can travel as an AMQP decimal."""
    return _decimal_problem("", value) is None


def is_utf8(text: str) -> bool:
    """True when ``text`` encodes as UTF-8 (holds no lone surrogate)."""
    return _utf8_size(text) is not None


def _decimal_problem(path: str, value: decimal.Decimal) -> str | None:
    # AMQP's decimal is a scale of 0..255 digits and a 32-bit signed mantissa (as pamqp encodes).
    if not value.is_finite():
        return f"header {path!r} is the decimal {value}, which AMQP cannot carry"
    exponent = int(value.as_tuple().exponent)
    scale = max(0, -exponent)
    mantissa = int(value.scaleb(scale))
    if scale > 255 or not -(2**31) <= mantissa < 2**31:
        return (
            f"header {path!r} holds the decimal {_shown(value)}, beyond AMQP's decimal "
            "(a 32-bit mantissa and at most 255 decimal places)"
        )
    return None


def _utf8_size(text: str) -> int | None:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 5]}...{text[-4:]}"
