"""The structured fields of a delivery's log lines, shared by every step that logs one."""

from __future__ import annotations

from dataclasses import dataclass

from rabbitretry.ledger import Key


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
