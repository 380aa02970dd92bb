"""Frames the AMQP client cannot decode, decoded leniently instead of closing the connection.

pamqp, the codec under aiormq and aio-pika, decodes every frame before rabbitretry sees the
message, and a value it cannot decode closes the whole connection. The broker then redelivers
the same message on the next connection, which dies the same way: one foreign message stops
its queue for good, and rabbitretry never gets to record it. Three such values are easy for a
producer in another language to send:

- a short string (``message_id``, ``correlation_id``, ``type``, ``app_id``…) or a header name
  that is not UTF-8: decoded with ``surrogateescape``, so its bytes are kept as lone
  surrogates (the ledger then stores the message dead as ``unstorable`` under an escaped key,
  or keeps the property in its marked form);
- a timestamp no ``datetime`` can hold (microseconds where seconds are due, or 2**64 - 1):
  read as absent (``None``), as if the producer had sent none.

:func:`install` replaces those decoders in pamqp's tables; ``rabbitretry.amqp`` calls it on
import. Everything pamqp can decode is decoded as before.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from pamqp import common
from pamqp import decode as pamqp_decode

_strict_timestamp = pamqp_decode.timestamp


def short_str(value: bytes) -> tuple[int, str]:
    """pamqp's short string, with bytes that are not UTF-8 kept as lone surrogates."""
    try:
        length = common.Struct.byte.unpack(value[0:1])[0]
    except (struct.error, TypeError) as error:
        raise ValueError("Could not unpack short string value") from error
    return length + 1, value[1 : length + 1].decode("utf-8", "surrogateescape")


def timestamp(value: bytes) -> tuple[int, datetime.datetime | None]:
    """pamqp's timestamp, or None for one out of any calendar's range."""
    try:
        return _strict_timestamp(value)
    except (ValueError, OverflowError, OSError) as error:
        if isinstance(error.__cause__, struct.error) or len(value) < 8:
            raise  # a truncated frame, not an odd value
        return 8, None


def field_table(value: bytes) -> tuple[int, dict[str, Any]]:
    """pamqp's field table, with header names that are not UTF-8 kept as lone surrogates."""
    try:
        length = common.Struct.integer.unpack(value[0:4])[0]
        offset = 4
        data: dict[str, Any] = {}
        end = offset + length
        if end > len(value):
            raise ValueError("Field table length exceeds available data")
        while offset < end:
            key_length = common.Struct.byte.unpack_from(value, offset)[0]
            offset += 1
            if offset + key_length > end:
                raise ValueError("Field table key length exceeds data")
            key = value[offset : offset + key_length].decode("utf-8", "surrogateescape")
            offset += key_length
            consumed, result = pamqp_decode.embedded_value(value[offset:])
            offset += consumed
            data[key] = result
        return end, data
    except (struct.error, TypeError) as error:
        raise ValueError("Could not unpack data") from error


def install() -> None:
    """Use the lenient decoders for properties and header tables (idempotent)."""
    pamqp_decode.METHODS["shortstr"] = short_str
    pamqp_decode.METHODS["timestamp"] = timestamp
    pamqp_decode.METHODS["table"] = field_table
    pamqp_decode.TABLE_MAPPING[b"T"] = timestamp
    pamqp_decode.TABLE_MAPPING[b"F"] = field_table
