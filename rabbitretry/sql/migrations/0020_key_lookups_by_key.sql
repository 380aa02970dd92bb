-- migration: outside a transaction
--
-- A statement that names one message and its state (`WHERE queue = $1 AND message_id = $2 AND
-- status = 'processing'`: the success mark, the start mark, a lease renewal, a retry) was
-- planned as a full scan of the partial index whose predicate its state matched, not as a
-- lookup of the primary key: PostgreSQL counts the few live rows of ledger_lease_idx and finds
-- it cheaper than the key. But every claim adds an entry to that index and every success
-- leaves it dead until a vacuum, and on a big ledger autovacuum comes after millions of
-- changes: each success mark then read the whole index, thousands of pages of dead entries
-- (1.8 ms of the server's CPU per statement with 1,700 pages of them, against 0.2 ms by key).
--
-- The two indexes of rows in flight now also require the time they are kept by, which those
-- statements do not mention, so they cannot use them and look their row up by key. The scans
-- they serve (`lease_until < ...`, `next_retry_at < ...`, and the counts that say `IS NOT
-- NULL`) imply it, and the check constraints already make it true of every row in them: the
-- indexes hold the same rows as before. Built CONCURRENTLY, so the workers go on meanwhile.

DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.ledger_lease_until_idx;
CREATE INDEX CONCURRENTLY ledger_lease_until_idx ON rabbitretry.ledger (lease_until)
    WHERE status = 'processing' AND lease_until IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.ledger_lease_idx;
ALTER INDEX rabbitretry.ledger_lease_until_idx RENAME TO ledger_lease_idx;

DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.ledger_retry_due_at_idx;
CREATE INDEX CONCURRENTLY ledger_retry_due_at_idx ON rabbitretry.ledger (next_retry_at)
    WHERE status = 'retrying' AND next_retry_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.ledger_retry_due_idx;
ALTER INDEX rabbitretry.ledger_retry_due_at_idx RENAME TO ledger_retry_due_idx;
