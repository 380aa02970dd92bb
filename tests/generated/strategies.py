"""Hostile messages, as Hypothesis strategies: headers, properties and bodies.

A :class:`Case` is one message and the client that sends it. Most cases go through aio-pika
(aiormq/pamqp encode them); a few through pika, which can send what aio-pika cannot: no
``message_id`` at all (aiormq stamps a random one on every message that has none) and short
string properties (``message_id``, ``correlation_id``, ``type``) that are not valid UTF-8.

What the *clients* refuse is not generated away but skipped with ``hypothesis.assume`` (see
:func:`client_refuses`): a message no client can put on the wire cannot reach a worker.
Checked against pamqp 4 and pika 1.3:

- pamqp refuses ``bytes`` header values (only ``bytearray``, as a byte array), integers outside
  the signed 64-bit range, decimals with a mantissa outside 32 bits or an exponent below -255 or
  above 0, floats too large for single precision (pamqp sends every float as ``f``),
  timestamps before 1970, strings with lone surrogates (neither client can encode them; neither
  can send invalid UTF-8 in a header string, so that input is out of reach), and short strings
  over 255 bytes;
- pika refuses floats in headers altogether, and lone surrogates;
- both produce a content header; one over RabbitMQ's ``frame_max`` (128 KiB) would be refused
  by the broker before any consumer sees it.

NaN and ±Infinity header values are *not* generated: pamqp encodes them, but RabbitMQ 3.10
answers by closing the publishing connection with 541 INTERNAL_ERROR. The publisher fails, not
the worker, so such a message never reaches the worker and has nothing to say about it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import struct
import zlib
from typing import Any, Literal

import aio_pika
import pika  # type: ignore[import-untyped]
from hypothesis import strategies as st
from pamqp.header import ContentHeader

FRAME_MAX = 131_072  # RabbitMQ's default frame_max; a content header must fit in one frame
MB = 1024 * 1024

Client = Literal["aio-pika", "pika"]

TOKEN = "{case-id" + "." * 23 + "}"
"""32 ASCII characters in every generated id; replaced by a fresh uuid4 hex when published,
so that no two examples share a ledger key (Hypothesis likes to repeat simple values)."""


@dataclasses.dataclass
class Case:
    """One generated message and the client that publishes it."""

    client: Client
    body: bytes
    message_id: str | bytes | None
    """``None`` or ``""`` are a message without an id; ``bytes`` only with pika (raw octets)."""
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    correlation_id: str | bytes | None = None
    type: str | bytes | None = None
    content_type: str | None = "application/json"
    content_encoding: str | None = None
    timestamp: dt.datetime | int | None = None
    """A datetime (aio-pika) or raw seconds since the epoch, up to 2**64 - 1 (pika)."""
    raw_headers: bytes | None = None
    """pika only: a header table sent as these bytes, in place of ``headers``. The clients'
    encoders recurse as the decoders do, so tables nested past a few hundred levels (which the
    broker routes) can only be sent this way."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis' printer
        printer.text(repr(self))

    def __repr__(self) -> str:  # the falsifying example, readable even with a 3 MB body
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["body"] = _abbreviated(self.body)
        fields["headers"] = _abbreviated(self.headers)
        fields["raw_headers"] = _abbreviated(self.raw_headers)
        shown = ("body", "headers", "raw_headers")
        fields = {k: v if k in shown else repr(v) for k, v in fields.items()}
        return "Case(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _abbreviated(value: Any, limit: int = 300) -> str:
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}…<{len(text)} chars>…{text[-limit // 4 :]}"


# --- strings --------------------------------------------------------------------------------

NASTY_CHARS = ["\x00", "\x01", "\x7f", "\ud800", "\udfff", "\ufeff", "\u202e", "é", "€", "😀"]


def nasty_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Short strings dense in NUL, control characters, surrogates and multi-byte characters."""
    return st.one_of(
        st.text(st.sampled_from([*NASTY_CHARS, "a", "b", " "]), max_size=max_size),
        st.text(max_size=max_size),
    )


@st.composite
def long_text(draw: st.DrawFn) -> str:
    """A very long string (up to ~60 KB), optionally with a nasty character inside."""
    size = draw(st.sampled_from([256, 4096, 65_000]))
    filler = draw(st.sampled_from(["x", "é", "😀"]))
    text = filler * (size // len(filler.encode()))
    if draw(st.booleans()):
        position = draw(st.integers(0, len(text)))
        text = text[:position] + draw(st.sampled_from(NASTY_CHARS)) + text[position:]
    return text


strings = st.one_of(nasty_text(), long_text())

# --- header values: every AMQP field type pamqp encodes -------------------------------------

INT_BOUNDS = [
    0, -1, 127, -128, 128, 255, 256, 32767, -32768, 65535, 65536,
    2**31 - 1, -(2**31), 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63),
    2**63, -(2**63) - 1, 2**64,
]  # fmt: skip

integers = st.one_of(st.sampled_from(INT_BOUNDS), st.integers())
floats = st.floats(allow_nan=False, allow_infinity=False)  # see the module docstring
decimals = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=None),
    st.builds(
        lambda mantissa, exponent: decimal.Decimal(mantissa).scaleb(-exponent),
        st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32 - 1]),
        st.sampled_from([0, 1, 2, 255, 256]),
    ),
)
timestamps = st.one_of(
    st.datetimes(timezones=st.just(dt.UTC)),
    st.sampled_from(
        [dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(2106, 2, 7, 6, 28, 16, tzinfo=dt.UTC)]
    ),
)
byte_arrays = st.binary(max_size=64).map(bytearray)

scalar_values = st.one_of(
    st.booleans(),
    integers,
    floats,
    decimals,
    strings,
    timestamps,
    byte_arrays,
    st.none(),
)

header_keys = st.one_of(
    nasty_text(max_size=20),
    st.sampled_from(
        [
            "a\x00b",
            "x-death",
            "x-delivery-count",
            "x-first-death-queue",
            "x-rabbitretry-attempts",
            "x-rabbitretry-reason",
            "k" * 129,  # pamqp truncates keys to 128 bytes
        ]
    ),
)

header_values = st.recursive(
    scalar_values,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(header_keys, children, max_size=4),
    ),
    max_leaves=12,
)

headers = st.dictionaries(header_keys, header_values, max_size=5)

# pika sends bytes as a byte array; it has no float type at all.
pika_scalar_values = st.one_of(
    st.booleans(),
    st.sampled_from(INT_BOUNDS),
    decimals,
    strings,
    timestamps,
    st.binary(max_size=64),
    st.none(),
)
pika_headers = st.dictionaries(
    header_keys,
    st.recursive(
        pika_scalar_values,
        lambda children: st.one_of(
            st.lists(children, max_size=3), st.dictionaries(header_keys, children, max_size=3)
        ),
        max_leaves=8,
    ),
    max_size=4,
)


def _table(entries: list[bytes]) -> bytes:
    """A field table of already encoded entries (name length, name, type, value)."""
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def _entry(name: bytes, kind: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + kind + value


def nested_table(depth: int, kinds: bytes = b"F") -> bytes:
    """``{"x": ...}`` with ``depth`` tables (``F``) and arrays (``A``) nested, in turn as in
    ``kinds``, around ``true``."""
    value = b"t\x01"
    for level in range(depth):
        if kinds[level % len(kinds)] == ord("F"):
            value = b"F" + _table([_entry(b"x", value[:1], value[1:])])
        else:
            value = b"A" + struct.pack(">I", len(value)) + value
    return _table([_entry(b"x", value[:1], value[1:])])


def wide_table(keys: int) -> bytes:
    return _table([_entry(b"k%05d" % n, b"t", b"\x01") for n in range(keys)])


def long_array_table(length: int) -> bytes:
    return _table([_entry(b"a", b"A", struct.pack(">I", 2 * length) + b"t\x01" * length)])


raw_header_tables = st.one_of(
    st.builds(
        nested_table,
        st.sampled_from([1, 63, 64, 65, 200, 800, 5_000, 18_000]),
        st.sampled_from([b"F", b"A", b"FA"]),
    ),
    st.builds(wide_table, st.sampled_from([1_000, 5_000, 12_000])),
    st.builds(long_array_table, st.sampled_from([1_000, 20_000, 60_000])),
)
"""Header tables built without recursion, up to what one frame holds: nested tables and arrays
far deeper than any decoder should follow, wide tables and long arrays."""


# --- short string properties: message_id, correlation_id, type -------------------------------


@st.composite
def identifiers(draw: st.DrawFn, token: str) -> str:
    """A property value built around ``token`` (so that every case has an id of its own).

    Edge cases: NUL, surrogates, unicode, control characters, exactly 254/255/256 bytes
    (multi-byte characters straddling the limit), and the empty string.
    """
    kind = draw(st.sampled_from(["plain", "nasty", "exact", "empty"]))
    if kind == "empty":
        return ""
    if kind == "plain":
        return token
    if kind == "nasty":
        before, after = draw(nasty_text(max_size=8)), draw(nasty_text(max_size=8))
        return before + token + after
    target = draw(st.sampled_from([254, 255, 256]))
    filler = draw(st.sampled_from(["a", "é", "€", "😀", "\x00"]))
    text = token
    while len((text + filler).encode()) <= target:
        text += filler
    return text + "a" * (target - len(text.encode()))


RAW_OCTETS = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\x80", b"\x00"]


@st.composite
def raw_identifiers(draw: st.DrawFn, token: str) -> bytes:
    """Short string octets that are not valid UTF-8 (only pika can send them)."""
    octets = draw(st.sampled_from(RAW_OCTETS))
    return octets + token.encode() if draw(st.booleans()) else token.encode() + octets


# --- bodies -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        nasty_text(max_size=20),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(nasty_text(max_size=8), children, max_size=4),
    ),
    max_leaves=15,
)


def _json_bytes(value: Any, ensure_ascii: bool) -> bytes:
    # A lone surrogate cannot be UTF-8 encoded raw: it stays a JSON \ud800 escape.
    return json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


@st.composite
def deep_json(draw: st.DrawFn) -> bytes:
    depth = draw(st.sampled_from([64, 200, 1_000, 10_000, 100_000]))
    if draw(st.booleans()):
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"null" + b"}" * depth


@st.composite
def huge_body(draw: st.DrawFn) -> bytes:
    """Megabytes, around the consumer's 1 MiB limit (a few MB at most)."""
    size = draw(st.sampled_from([MB - 2, MB - 1, MB + 1, 3 * MB]))
    return b'"' + b"x" * (size - 2) + b'"'


def _rarely(strategy: st.SearchStrategy[bytes], other: st.SearchStrategy[bytes]) -> Any:
    # Hypothesis shrinks integers towards 0: the rare branch is the other end.
    return st.integers(0, 31).flatmap(lambda n: strategy if n == 31 else other)


NUMBERS_PAST_LIMITS = [
    b"1" + b"0" * 400,
    b"-" + b"9" * 5_000,
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"0." + b"0" * 1000 + b"1",
    b"123456789012345678901234567890.5e-3",
    b'{"n": ' + b"9" * 4_300 + b"}",  # past CPython's int-to-str digit limit
]

SPECIAL_BODIES = [
    b"",
    b"null",
    b" ",
    b"\x00",
    b"true",
    b'"\x00"',
    b'"\\u0000"',
    b'"\\ud800"',
    b'{"a": "\\udfff"}',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    b"{}",
    b"[]",
    b'{"a": 1, "a": 2}',
    b"{not json",
    b"\xff\xfe{\x00}\x00",
]

ordinary_bodies = st.one_of(
    st.builds(_json_bytes, json_values, st.booleans()),
    st.sampled_from(SPECIAL_BODIES),
    st.sampled_from(NUMBERS_PAST_LIMITS),
    st.binary(max_size=64),  # mostly invalid UTF-8
    deep_json(),
    st.builds(lambda v: zlib.compress(_json_bytes(v, True)), json_values),
)

bodies: st.SearchStrategy[bytes] = _rarely(huge_body(), ordinary_bodies)

content_encodings = st.one_of(
    st.none(),
    st.sampled_from(["gzip", "deflate", "br", "utf-16", "identity", "x-unknown", ""]),
    nasty_text(max_size=10),
)


# --- cases ------------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn, body: st.SearchStrategy[bytes] = bodies) -> Case:
    token = TOKEN  # the rig swaps in a fresh id of the same length at publish time
    client: Client = draw(st.sampled_from(["aio-pika"] * 5 + ["pika"]))
    optional_id = st.one_of(st.none(), identifiers(token))
    if client == "aio-pika":
        return Case(
            client="aio-pika",
            body=draw(body),
            message_id=draw(identifiers(token)),
            headers=draw(headers),
            correlation_id=draw(optional_id),
            type=draw(optional_id),
            content_encoding=draw(content_encodings),
            timestamp=draw(st.one_of(st.none(), timestamps)),
        )
    raw_or_text = st.one_of(st.none(), identifiers(token), raw_identifiers(token))
    return Case(
        client="pika",
        body=draw(body),
        message_id=draw(raw_or_text),
        headers=draw(pika_headers),
        raw_headers=draw(st.one_of(st.none(), raw_header_tables)),
        correlation_id=draw(raw_or_text),
        type=draw(raw_or_text),
        content_encoding=draw(content_encodings),
        timestamp=draw(
            st.one_of(
                st.none(),
                st.sampled_from([0, 2**32 - 1, 2**32, 1_700_000_000_000_000, 2**63, 2**64 - 1]),
            )
        ),
    )


# --- what the clients refuse ----------------------------------------------------------------


def aio_pika_message(case: Case) -> aio_pika.Message:
    return aio_pika.Message(
        case.body,
        message_id=case.message_id,  # type: ignore[arg-type]
        headers=case.headers,
        correlation_id=case.correlation_id,  # type: ignore[arg-type]
        type=case.type,  # type: ignore[arg-type]
        content_type=case.content_type,
        content_encoding=case.content_encoding,
        timestamp=case.timestamp,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


class _RawHeaderProperties(pika.BasicProperties):  # type: ignore[misc]
    """pika's properties with the header table spliced in as raw bytes (``Case.raw_headers``)."""

    raw_headers: bytes = b""

    def encode(self) -> list[bytes]:
        pieces: list[bytes] = super().encode()
        (flags,) = struct.unpack(">H", pieces[0])
        # The table goes after content_type and content_encoding (two pieces each when set).
        at = 1 + 2 * (self.content_type is not None) + 2 * (self.content_encoding is not None)
        flags |= self.FLAG_HEADERS
        return [struct.pack(">H", flags), *pieces[1:at], self.raw_headers, *pieces[at:]]


def pika_properties(case: Case) -> pika.BasicProperties:
    if case.raw_headers is not None:
        raw = _RawHeaderProperties(
            message_id=case.message_id or None,
            correlation_id=case.correlation_id,
            type=case.type,
            content_type=case.content_type,
            content_encoding=case.content_encoding,
            timestamp=case.timestamp,
            delivery_mode=2,
        )
        raw.raw_headers = case.raw_headers
        return raw
    return pika.BasicProperties(
        message_id=case.message_id or None,
        headers=case.headers or None,
        correlation_id=case.correlation_id,
        type=case.type,
        content_type=case.content_type,
        content_encoding=case.content_encoding,
        timestamp=case.timestamp,
        delivery_mode=2,
    )


ENCODING_ERRORS = (TypeError, ValueError, OverflowError, struct.error, UnicodeError)


def client_refuses(case: Case) -> str | None:
    """Why the case's client cannot encode it (None when it can): such a case is skipped."""
    try:
        if case.client == "aio-pika":
            message = aio_pika_message(case)
            size = len(ContentHeader(0, len(case.body), message.properties).marshal())
        else:
            size = sum(len(piece) for piece in pika_properties(case).encode())
    except ENCODING_ERRORS as error:
        return f"{type(error).__name__}: {error}"
    except pika.exceptions.AMQPError as error:
        return f"{type(error).__name__}: {error}"
    if size > FRAME_MAX - 8:
        return f"a content header of {size} bytes does not fit in one frame"
    return None
