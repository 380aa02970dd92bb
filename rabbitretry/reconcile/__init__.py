"""The reconciler: the safety net for what the broker lost.

- ``reconciler``: :class:`~rabbitretry.reconcile.reconciler.Reconciler`, running the steps in
  order on an interval, with its heartbeat;
- ``run``: one pass's report and what each step is given;
- ``redrive``: ``retrying`` rows whose copy never came back and ``processing`` rows whose lease
  lapsed, republished from the snapshot (or skipped when expired);
- ``stuck_outbox``: outbox rows no relay published;
- ``expected`` and ``windows``: what the application expected against what was handled (pure,
  then against the ledger and the broker);
- ``dead_queue``: what reached a dead-letter queue without a terminal ledger row;
- ``pacing``: the rate of republishing.

Its ledger writes are in :mod:`rabbitretry.ledger.repairs`.
"""
