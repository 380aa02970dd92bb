"""The delivery path: one message from the broker, through the ledger, to its outcome.

``worker`` runs consumers; ``pipeline`` is the I/O of one delivery (gates, claim, attempt,
settle), with ``verdicts`` writing what the attempt decided to the ledger, ``copies`` publishing
the retry, parked and dead copies from the delivery's snapshot, ``lease`` keeping the claim
while the attempt runs, ``settle`` acking or requeueing, and ``log_fields`` the fields of its
log lines; ``outage`` pauses deliveries while the ledger or the broker is away; ``attempt`` is
the pure attempt core (parse, skip, handler, retry decision) that ``rabbitretry.testing`` runs
too; ``transaction`` is the handler's transaction; ``outcome`` the vocabulary of what became of
a delivery.
"""
