"""Fault drills: rabbitretry consuming under SIGKILLs, cut connections and a broker restart.

Run ``python -m drills --help`` (or ``make drill``). The drill publishes seeded messages, runs
``rabbitretry run`` in a supervised subprocess, injects faults while the work flows, and then
checks the ledger and the handler's effects table: every message finished exactly once.
rabbitretry itself never imports this package.
"""
