"""The drill's clock: seconds since the drill started, and progress lines stamped with them."""

from __future__ import annotations

import time
from collections.abc import Callable


class Clock:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.start = time.monotonic()
        self._say = say

    def now(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        self._say(f"[{self.now():6.1f}s] {text}")
