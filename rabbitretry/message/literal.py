"""Text from outside shown as it is: nothing in it may steer what a person reads. Pure.

Keys, headers, error messages and payloads come from producers and callers. Escaping keeps
markup inert (Jinja2's autoescape on a page, rich's markup in a terminal); this module keeps the
text itself honest: control characters (a terminal's escape sequences among them) and the
bidirectional overrides and marks, which would reorder or hide what an operator reads
(``invoice-\u202egpj.exe``), are spelled out as ``[U+202E]``.
"""

from __future__ import annotations

import re

# C0 and C1 controls, and the Unicode bidi controls and marks.
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str, keep: str = "\t\n") -> str:
    """``text`` with its hidden and direction-changing characters spelled out, but those in
    ``keep`` (by default tab and newline: a page or a table lays them out)."""
    return _HIDDEN.sub(lambda m: m[0] if m[0] in keep else f"[U+{ord(m[0]):04X}]", text)
