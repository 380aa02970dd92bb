"""The ledger: one row per ``(queue, message_id)``, the single source of truth for a message.

``statements`` holds the typed calls over the named SQL statements, ``commits`` the commit
groups that write concurrent attempts together, and ``attempts`` the one interface through which
the delivery pipeline writes. What is exported here serves readers of the ledger (operations,
the reconciler, the console) and tests that set up a state.
"""

from rabbitretry.ledger.attempts import AttemptLedger
from rabbitretry.ledger.commits import ClaimRequest, SuccessRequest
from rabbitretry.ledger.statements import (
    FINISHED,
    MISSING_ID_PREFIX,
    Claim,
    Key,
    Snapshot,
    Verdict,
    claim,
    get,
    missing_id_key,
    schedule_retry,
    snapshot_of,
)

__all__ = [
    "FINISHED",
    "MISSING_ID_PREFIX",
    "AttemptLedger",
    "Claim",
    "ClaimRequest",
    "Key",
    "Snapshot",
    "SuccessRequest",
    "Verdict",
    "claim",
    "get",
    "missing_id_key",
    "schedule_retry",
    "snapshot_of",
]
