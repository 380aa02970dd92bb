"""Benchmarks of rabbitretry against its anchors: the raw broker, a naive ledger, dramatiq.

Run as ``python -m bench`` (``make bench``, or ``make bench-quick`` for a short run). Every
figure comes from one run on one broker and one database, so the ratios between variants are
the numbers to read; absolute rates depend on the machine and on what else it is doing.
"""
