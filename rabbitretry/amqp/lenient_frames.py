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
  read as absent (``None``), as if the producer had sent none;
- a header table nested deeper than :data:`MAX_DEPTH` tables and arrays (the broker routes one
  nested 800 levels deep without complaint, and pamqp decodes it recursively until Python's
  stack runs out, inside the client's reader task): the message's headers are replaced by
  :func:`rabbitretry.message.headers.undecodable`, a marker that keeps the raw table's bytes,
  and the worker records the message dead, reason ``undecodable``.

:func:`install` replaces those decoders in pamqp's tables; ``rabbitretry.amqp`` calls it on
import. Everything pamqp can decode is decoded as before.
"""

from __future__ import annotations

import datetime
import struct
import threading
from collections.abc import Callable
from typing import Any

from pamqp import common
from pamqp import decode as pamqp_decode

from rabbitretry.message import headers

MAX_DEPTH = 64
"""Tables and arrays nested in one header table that are decoded; deeper is ``undecodable``.

Far beyond what any producer needs, and far below Python's recursion limit (each level costs
pamqp three frames of the stack)."""

_strict_timestamp = pamqp_decode.timestamp
_strict_array = pamqp_decode.field_array
_nesting = threading.local()  # the depth of the table being decoded, per decoding thread


class TooDeep(ValueError):
    """A header table nested deeper than :data:`MAX_DEPTH`."""


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


def bounded_table(value: bytes) -> tuple[int, dict[str, Any]]:
    """A whole field table (a message's headers); a marker with its raw bytes if nested too deep.

    The table's length comes first, so what follows it in the frame is still read right.
    """
    try:
        return field_table(value)
    except (TooDeep, RecursionError) as error:
        length = common.Struct.integer.unpack(value[0:4])[0]
        return 4 + length, headers.undecodable(str(error), value[4 : 4 + length])


Decoder = Callable[[bytes], tuple[int, Any]]


def _nested(decode: Decoder) -> Decoder:
    """``decode`` for a table or array inside a table: one level deeper, refused past the bound."""

    def one_level_deeper(value: bytes) -> tuple[int, Any]:
        depth = getattr(_nesting, "depth", 0)
        if depth >= MAX_DEPTH:
            raise TooDeep(f"a header table nested deeper than {MAX_DEPTH} tables and arrays")
        _nesting.depth = depth + 1
        try:
            return decode(value)
        finally:
            _nesting.depth = depth

    return one_level_deeper


def install() -> None:
    """Use the lenient decoders for properties and header tables (idempotent)."""
    pamqp_decode.METHODS["shortstr"] = short_str
    pamqp_decode.METHODS["timestamp"] = timestamp
    pamqp_decode.METHODS["table"] = bounded_table
    pamqp_decode.TABLE_MAPPING[b"T"] = timestamp
    pamqp_decode.TABLE_MAPPING[b"F"] = _nested(field_table)
    pamqp_decode.TABLE_MAPPING[b"A"] = _nested(_strict_array)
