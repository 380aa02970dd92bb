"""The ledger: one row per ``(queue, message_id)``, the single source of truth for a message.

This package is the only writer of the ledger and the attempt log (a test checks that no other
module runs a statement that changes them):

- ``statements``: the typed calls over the named statements of one delivery's attempts;
- ``commits``: the commit groups that write concurrent attempts together;
- ``attempts``: the one interface through which the delivery pipeline writes;
- ``failures``: what is recorded of a failure (type, bounded message and traceback, fingerprint);
- ``operator``: the writes an operator's actions make (ignore, undo, payload edits, replays);
- ``repairs``: the writes the reconciler makes to repair what the broker lost;
- ``retention``: what ``rabbitretry ledger prune`` removes;
- ``downstreams``: the downstream breakers' shared state (their failures forgive the attempts
  they charged);
- ``recover_hooks``: which queues' dead messages get a run of their consumer's ``on_dead``.

What is exported here serves readers of the ledger (operations, the reconciler, the console)
and tests that set up a state.
"""

from rabbitretry.ledger.attempts import AttemptLedger
from rabbitretry.ledger.commits import AttemptRef, ClaimRequest
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
    "AttemptRef",
    "Claim",
    "ClaimRequest",
    "Key",
    "Snapshot",
    "Verdict",
    "claim",
    "get",
    "missing_id_key",
    "schedule_retry",
    "snapshot_of",
]
