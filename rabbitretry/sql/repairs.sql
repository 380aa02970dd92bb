-- The ledger writes the reconciler makes to repair what the broker lost (run by
-- rabbitretry/ledger/repairs.py: ledger/ is the only writer of the ledger tables). The scans
-- take a bounded batch with FOR UPDATE SKIP LOCKED and mark what they took in the same
-- statement, so that reconcilers running side by side never take the same row.

-- name: reconcile_overdue_retries
-- `retrying` rows overdue by more than $1 seconds (their delay copy never came back); at most
-- $2, marked re-driven. A row re-driven before is left alone for $1 seconds, doubling with each
-- re-drive up to 64 × $1: a queue whose workers are down is not filled with copies. Served by
-- ledger_retry_due_idx (status = 'retrying', next_retry_at).
WITH due AS (
    SELECT queue, message_id FROM rabbitretry.ledger
    WHERE status = 'retrying' AND next_retry_at < now() - make_interval(secs => $1)
      AND (redriven_at IS NULL
           OR redriven_at < now() - make_interval(secs => $1 * 2 ^ least(redrives - 1, 6)))
    ORDER BY next_retry_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE rabbitretry.ledger l
SET redriven_at = now(), redrives = l.redrives + 1
FROM due
WHERE l.queue = due.queue AND l.message_id = due.message_id
RETURNING l.queue, l.message_id, l.attempts, l.first_seen, l.payload, l.headers, l.properties,
          l.exchange, l.routing_key;

-- name: reconcile_expired_leases
-- `processing` rows whose lease ran out more than $1 seconds ago (the worker died and its
-- delivery was lost); at most $2, marked re-driven, with the same hold-off as above. Served by
-- ledger_lease_idx (status = 'processing', lease_until).
WITH due AS (
    SELECT queue, message_id FROM rabbitretry.ledger
    WHERE status = 'processing' AND lease_until < now() - make_interval(secs => $1)
      AND (redriven_at IS NULL
           OR redriven_at < now() - make_interval(secs => $1 * 2 ^ least(redrives - 1, 6)))
    ORDER BY lease_until
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE rabbitretry.ledger l
SET redriven_at = now(), redrives = l.redrives + 1
FROM due
WHERE l.queue = due.queue AND l.message_id = due.message_id
RETURNING l.queue, l.message_id, l.attempts, l.first_seen, l.payload, l.headers, l.properties,
          l.exchange, l.routing_key;

-- name: reconcile_skip_expired
-- Work that is no longer valid ($3: the reason) is finished as skipped, never executed: a
-- retry waiting for its turn, or an attempt whose worker died (its open attempt is closed by
-- rabbitretry.close_lapsed_attempt).
-- Returns 1 when the row was skipped, 0 when it had moved on meanwhile.
WITH skipped AS (
    UPDATE rabbitretry.ledger
    SET status = 'skipped', reason = $3, finished_at = now(), updated_at = now(),
        next_retry_at = NULL, lease_until = NULL
    WHERE queue = $1 AND message_id = $2
      AND (status = 'retrying' OR (status = 'processing' AND lease_until < now()))
    RETURNING queue, message_id, attempts
), closed AS (
    SELECT rabbitretry.close_lapsed_attempt(s.queue, s.message_id, s.attempts)
    FROM skipped s
)
SELECT count(*)::int FROM closed;

-- name: dead_queue_record
-- Messages taken off work queue $1's dead-letter queue, stored dead unless the ledger already
-- has their key (rabbitretry.record_broker_dead); the keys inserted.
SELECT message_id FROM rabbitretry.record_broker_dead($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                                                      $11) AS message_id;

-- name: refuse_in_flight
-- A message whose copies are refused before the claim ($3: the reason, e.g. too-large; $4-$6:
-- the failure's type, message and fingerprint) can never be handled: a row still in flight, a
-- `retrying` one or a `processing` one whose lease ran out, is finished dead with that reason
-- (its open attempt closed by rabbitretry.close_lapsed_attempt), so that nothing re-drives it. A live lease is left to its
-- owner. Returns 1 when the row died, 0 when it was not in flight.
WITH refused AS (
    UPDATE rabbitretry.ledger
    SET status = 'dead', reason = $3, error_type = $4, error_message = $5,
        error_traceback = NULL, error_fingerprint = $6, finished_at = now(), updated_at = now(),
        next_retry_at = NULL, lease_until = NULL
    WHERE queue = $1 AND message_id = $2
      AND (status = 'retrying' OR (status = 'processing' AND lease_until < now()))
    RETURNING queue, message_id, attempts
), closed AS (
    SELECT rabbitretry.close_lapsed_attempt(r.queue, r.message_id, r.attempts)
    FROM refused r
)
SELECT count(*)::int FROM closed;
