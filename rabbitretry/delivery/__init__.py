"""The delivery path: one message from the broker, through the ledger, to its outcome.

``worker`` runs consumers; ``pipeline`` is the I/O of one delivery (claim, publish, settle);
``attempt`` is the pure attempt core (parse, skip, handler, retry decision) that
``rabbitretry.testing`` runs too; ``transaction`` is the handler's transaction; ``outcome`` the
vocabulary of what became of a delivery.
"""
