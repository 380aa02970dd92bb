"""The structured fields of a delivery's log lines, shared by every step that logs one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from rabbitretry.delivery.outcome import Outcome
from rabbitretry.ledger import Key
from rabbitretry.message.storable import storable_text


@dataclass(frozen=True)
class LogFields:
    """The fields (``extra``, see rabbitretry/logs.py) of one pipeline's delivery log lines."""

    queue: str
    worker: str

    def __call__(
        self, key: Key | None = None, *, message_id: str | None = None, **known: object
    ) -> dict[str, object]:
        """queue, message_id, worker, and those of ``known`` that are not None."""
        fields = {
            "queue": self.queue,
            "message_id": key.message_id if key is not None else message_id,
            "worker": self.worker,
            **known,
        }
        return {name: value for name, value in fields.items() if value is not None}

    def ended(self, log: logging.Logger, outcome: Outcome, received_at: datetime) -> Outcome:
        """The line that ends each delivery (DEBUG, ``run -v``): its outcome and duration."""
        if not log.isEnabledFor(logging.DEBUG):
            return outcome  # the hot path: no fields to build for a line nobody reads
        duration = (datetime.now(UTC) - received_at).total_seconds()
        log.debug(
            "%s: %s (attempt %d, %.3f s)",
            storable_text(str(outcome.key or self.queue)),
            outcome.result,
            outcome.attempt,
            duration,
            extra=self(
                outcome.key,
                attempt=outcome.attempt or None,
                outcome=outcome.result,
                duration=round(duration, 6),
                handler_duration=outcome.handler_seconds,
            ),
        )
        return outcome
