"""The ledger: one row per ``(queue, message_id)``, the single source of truth for a message.

``statements`` holds the typed calls over the named SQL statements, ``commits`` the commit
groups that write concurrent attempts together, and ``attempts`` the one interface through which
the delivery pipeline writes.
"""

from rabbitretry.ledger.attempts import AttemptLedger
from rabbitretry.ledger.commits import ClaimRequest, SuccessRequest
from rabbitretry.ledger.statements import (
    Claim,
    Key,
    Snapshot,
    Verdict,
    claim,
    claim_of,
    confirm_retry_copy,
    finish,
    get,
    interrupt,
    record_rejected,
    renew_lease,
    schedule_retry,
    snapshot_of,
)

__all__ = [
    "AttemptLedger",
    "Claim",
    "ClaimRequest",
    "Key",
    "Snapshot",
    "SuccessRequest",
    "Verdict",
    "claim",
    "claim_of",
    "confirm_retry_copy",
    "finish",
    "get",
    "interrupt",
    "record_rejected",
    "renew_lease",
    "schedule_retry",
    "snapshot_of",
]
