-- migration: outside a transaction
--
-- What 0013 and 0014 need that reads a whole table, done without stopping the workers: each
-- statement commits on its own, an index is built CONCURRENTLY (writes go on while it is
-- built) and a constraint is validated under a lock that lets reads and writes through. Every
-- statement can run again: a run cut short (an index left invalid) is picked up where it was.

-- The attempts a trip forgives: charged failures of one downstream, by when their retry was
-- due. Its columns are set once, by the failure, so that the start mark and the finish of
-- every other attempt stay HOT updates (no index entry written).
DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.attempt_downstream_due_idx;
CREATE INDEX CONCURRENTLY attempt_downstream_due_idx ON rabbitretry.attempt (downstream, retry_at)
    WHERE downstream IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.attempt_downstream_idx;
ALTER INDEX rabbitretry.attempt_downstream_due_idx RENAME TO attempt_downstream_idx;

-- ledger prune's skipped and ignored rows (few, written once): found without a scan.
DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.ledger_set_aside_idx;
CREATE INDEX CONCURRENTLY ledger_set_aside_idx ON rabbitretry.ledger (finished_at)
    WHERE status IN ('skipped', 'ignored');

ALTER TABLE rabbitretry.ledger VALIDATE CONSTRAINT ledger_snapshot_kept;
