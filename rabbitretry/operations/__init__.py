"""What an operator does to failed messages, shared by the CLI and the console.

Both front ends call these functions, so a filter, a group or a replay means the same thing on
the page and in a terminal. Decisions (filters, rates, payload checks, export lines) are pure
functions; the I/O functions run the named statements of ``sql/operations.sql``, write the
ledger only through :mod:`rabbitretry.ledger.operator`, and every action writes the audit
table: who, when, what, how many.

- :mod:`~rabbitretry.operations.selection`: the :class:`Filter` and what it lists and groups
- :mod:`~rabbitretry.operations.replay`: replays of many messages (targets, rate, canary)
- :mod:`~rabbitretry.operations.dead_letter`: the replay of one, under its row lock
- :mod:`~rabbitretry.operations.ignore`: ignore, and undo an ignore
- :mod:`~rabbitretry.operations.export`: JSON lines of the matching messages
- :mod:`~rabbitretry.operations.audit`: the audit rows
- :mod:`~rabbitretry.operations.payload`: payloads shown and checked
- :mod:`~rabbitretry.operations.downstreams`: the downstream breakers listed, held open, closed
"""

from rabbitretry.operations.audit import recent_audit
from rabbitretry.operations.errors import OperationError
from rabbitretry.operations.export import export, export_line
from rabbitretry.operations.ignore import ignore, ignore_many, unignore
from rabbitretry.operations.payload import checked_payload, payload_text
from rabbitretry.operations.replay import (
    Progress,
    ReplayReport,
    edit_and_replay,
    parse_rate,
    pause_before,
    replay,
    replay_targets,
    sender,
)
from rabbitretry.operations.selection import (
    STATUSES,
    Filter,
    compacted,
    find,
    groups,
    history,
    list_messages,
    recover_run,
)

__all__ = [
    "STATUSES",
    "Filter",
    "OperationError",
    "Progress",
    "ReplayReport",
    "checked_payload",
    "compacted",
    "edit_and_replay",
    "export",
    "export_line",
    "find",
    "groups",
    "history",
    "ignore",
    "ignore_many",
    "list_messages",
    "parse_rate",
    "pause_before",
    "payload_text",
    "recent_audit",
    "recover_run",
    "replay",
    "replay_targets",
    "sender",
    "unignore",
]
