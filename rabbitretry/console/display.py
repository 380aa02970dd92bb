"""How stored values are shown: nothing in them may steer the page. Pure functions, no I/O.

Keys, errors and payloads are attacker-controlled text. Escaping (Jinja2's autoescape) keeps
markup inert; this module keeps the text itself honest: bidirectional-override and other
control characters, which would reorder or hide what an operator reads
(``invoice-\u202egpj.exe``), are shown as ``[U+202E]``, and a payload that is not text is
shown as hex and base64 with its size, not as replacement characters.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from rabbitretry import operations
from rabbitretry.message.literal import visible

__all__ = ["Payload", "finalize", "payload", "verbatim", "visible"]

HEX_SHOWN = 4096  # bytes of a binary payload shown in hex; base64 has them all


def finalize(value: Any) -> Any:
    """Every ``{{ value }}`` of a page goes through here (Jinja2's finalize hook); markup a
    template made (a macro's output, ``verbatim``) has had its own values shown already."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return visible(value)
    return value


def verbatim(text: str) -> Markup:
    """``text`` escaped but otherwise untouched: for a form field that must send it back."""
    return Markup.escape(text)


@dataclass(frozen=True)
class Payload:
    size: int
    text: str | None
    """Pretty JSON, or the text; None when the payload is not text."""
    hex: str
    base64: str


def payload(body: bytes) -> Payload:
    return Payload(len(body), _as_text(body), _hex_dump(body[:HEX_SHOWN]), _base64(body))


def _as_text(body: bytes) -> str | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if re.search("[\x00-\x08\x0e-\x1f]", text):
        return None  # decodes, but as control characters: binary all the same
    return operations.payload_text(body)


def _hex_dump(body: bytes) -> str:
    rows = (body[offset : offset + 16] for offset in range(0, len(body), 16))
    return "\n".join(f"{16 * n:08x}  {row.hex(' ')}" for n, row in enumerate(rows))


def _base64(body: bytes) -> str:
    return base64.b64encode(body).decode()
