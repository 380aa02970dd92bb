"""What an operator watches.

- ``metrics``: Prometheus metrics and the ``/healthz`` endpoint of a worker;
- ``levels``: the service levels measured from the ledger and the broker;
- ``thresholds``: those levels judged against thresholds (pure);
- ``alerts`` and ``alert_content``: alerts raised, delivered to a webhook, and what they say;
- ``downstream_alerts``: what a downstream breaker's alert adds at delivery (messages waiting);
- ``heartbeat``: the heartbeats of periodic components, so a silent one is noticed.
"""
