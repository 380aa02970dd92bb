"""The form in which a message's headers and properties are stored: JSON that PostgreSQL takes.

AMQP field tables carry what JSON cannot (byte arrays, decimals, timestamps) and what
PostgreSQL refuses in ``jsonb`` and ``text`` (NUL characters, lone surrogates). A foreign
producer can send any of them, so the ledger stores tables in a tagged JSON form that loses
nothing and is always accepted; values that need it are marked::

    {"$bytes": "<base64>"}       a byte array
    {"$decimal": "1.50"}         a decimal
    {"$timestamp": "<ISO 8601>"} a timestamp
    {"$text": "<base64>"}        a string PostgreSQL refuses (UTF-8, surrogates kept)
    {"$float": "nan"}            a float JSON has no literal for
    {"$table": [[key, value]…]}  a table whose keys need any of the above, or look like a tag

Plain strings, numbers, booleans, null, lists and tables stay as they are, so stored headers
read naturally in ``dead show`` and the console. Pure functions.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from rabbitretry.message.wire import is_utf8

TAGS = ("$bytes", "$decimal", "$timestamp", "$text", "$float", "$table")


def is_storable_text(text: str) -> bool:
    """True when PostgreSQL stores ``text`` as it is (no NUL, valid UTF-8)."""
    return "\x00" not in text and is_utf8(text)


def storable_text(text: str) -> str:
    """``text`` with NUL and lone surrogates written as escapes: for names and log-like fields."""
    if is_storable_text(text):
        return text
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped.replace("\x00", "\\x00")


def encode_table(table: Mapping[str, Any] | None) -> str:
    """The JSON text stored for an AMQP field table (headers, or the kept properties)."""
    return json.dumps(_table(table or {}), allow_nan=False)


def decode_table(stored: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The field table back from its stored form (plain JSON of older rows reads as it is)."""
    if stored is None:
        return {}
    value = json.loads(stored) if isinstance(stored, str) else stored
    decoded = _decode(value)
    return decoded if isinstance(decoded, dict) else {}


def _table(table: Mapping[str, Any]) -> dict[str, Any]:
    keys = [str(key) for key in table]
    if all(is_storable_text(key) and key not in TAGS for key in keys):
        return {str(key): _value(value) for key, value in table.items()}
    return {"$table": [[_value(str(key)), _value(value)] for key, value in table.items()]}


def _value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, str):
        return value if is_storable_text(value) else {"$text": _b64(_utf8(value))}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": _b64(bytes(value))}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime):
        return {"$timestamp": value.isoformat()}
    if isinstance(value, Mapping):
        return _table(value)
    if isinstance(value, list | tuple):
        return [_value(item) for item in value]
    return {"$text": _b64(_utf8(repr(value)))}  # nothing AMQP decodes to; kept as its repr


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$bytes":
            return bytearray(base64.b64decode(inner))  # as aio-pika delivers a byte array
        if tag == "$decimal":
            return Decimal(inner)
        if tag == "$timestamp":
            return datetime.fromisoformat(inner)
        if tag == "$text":
            return base64.b64decode(inner).decode("utf-8", "surrogatepass")
        if tag == "$float":
            return float(inner)
        if tag == "$table":
            return {_decode(key): _decode(item) for key, item in inner}
    return {key: _decode(item) for key, item in value.items()}


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
