"""HMAC signatures of callbacks: who sent it, and not too long ago.

A sender signs ``f"{timestamp}.".encode() + body`` with a shared secret (HMAC-SHA256, hex) and
sends the digest and the timestamp (Unix seconds) in two headers. Signing the timestamp with
the body means a captured request cannot be replayed later with a fresh timestamp; the
tolerance bounds how long a captured request stays usable at all.

Pure functions: the clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass


def sign(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``timestamp.body``: what a sender puts in the signature header."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


LONGEST_TIMESTAMP = 12
"""Digits in a Unix time: 11 last until the year 5138. Checked before ``int()``, so an absurd
header (400 digits overflow a float, 5,000 exceed Python's digit limit) is a refusal."""


def unix_seconds(text: str) -> int | None:
    """``text`` as a Unix time: ASCII digits only, as senders write it. ``int()`` alone would
    also take ``1_700_000_000``, spaces and other scripts' digits, which the signature does
    not cover as written."""
    if text.isascii() and text.isdigit() and len(text) <= LONGEST_TIMESTAMP:
        return int(text)
    return None


@dataclass(frozen=True)
class HmacSignature:
    """How a callback kind's sender proves itself: an HMAC-SHA256 over timestamp and body.

    ``header`` carries the hex digest (a ``sha256=`` prefix is accepted), ``timestamp_header``
    the Unix time it was signed at; a request signed more than ``tolerance`` seconds from the
    receiver's clock (either way) is refused, so a captured request cannot be replayed later.
    """

    secret: str | bytes
    header: str = "X-Signature"
    timestamp_header: str = "X-Signature-Timestamp"
    tolerance: float = 300.0

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("an HmacSignature needs a non-empty secret")
        if self.tolerance <= 0:
            raise ValueError("an HmacSignature needs a positive tolerance in seconds")

    def headers(self, body: bytes, now: float) -> dict[str, str]:
        """The headers a sender adds to ``body`` signed at ``now`` (for senders and tests)."""
        timestamp = int(now)
        return {
            self.header: sign(self.secret, timestamp, body),
            self.timestamp_header: str(timestamp),
        }

    def refusal(self, headers: Mapping[str, str], body: bytes, now: float) -> str | None:
        """Why the request is refused (401), or None when its signature is good and fresh."""
        given = headers.get(self.header.lower())
        stamp = headers.get(self.timestamp_header.lower())
        if not given or not stamp:
            return f"missing {self.header} or {self.timestamp_header} header"
        timestamp = unix_seconds(stamp)
        if timestamp is None:
            return f"{self.timestamp_header} is not a Unix time in seconds (ASCII digits)"
        if abs(now - timestamp) > self.tolerance:
            return f"{self.timestamp_header} is more than {self.tolerance:g} s from now"
        expected = sign(self.secret, timestamp, body)
        given = given.removeprefix("sha256=")
        # Constant time: the comparison must not tell an attacker how many characters matched.
        if not hmac.compare_digest(expected.encode(), given.encode(errors="replace")):
            return "the signature does not match"
        return None
