"""What an operator watches: metrics and the health endpoint, measured levels and the thresholds
that judge them, alerts, heartbeats."""
