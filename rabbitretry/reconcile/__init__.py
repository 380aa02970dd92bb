"""The reconciler: re-drives what the broker lost, applies business expiry, compares what was
expected with what was handled, and records what the broker dead-lettered on its own."""
