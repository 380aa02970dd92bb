-- Every statement rabbitretry runs against the ledger, loaded by name (see rabbitretry/db.py).
-- Parameters are positional ($1, $2, ...); each block starts with a "-- name:" line.

-- name: claim
SELECT verdict, attempt, budget_attempt, wait_seconds, status
FROM rabbitretry.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: renew_lease
-- Extends the lease of a running attempt; no row means the attempt is no longer ours.
UPDATE rabbitretry.ledger
SET lease_until = now() + make_interval(secs => $4)
WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
RETURNING 1;

-- name: finish_attempt
-- Closes attempt $3 of a key as succeeded, dead or skipped; the ledger row follows in the same
-- statement. No row returned means the attempt had lost its lease to another one.
WITH finished AS (
    UPDATE rabbitretry.ledger
    SET status = $4, reason = $5, error_type = $6, error_message = $7, error_traceback = $8,
        error_fingerprint = $9, finished_at = now(), updated_at = now(),
        lease_until = NULL, next_retry_at = NULL
    WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
    RETURNING queue, message_id, attempts
)
UPDATE rabbitretry.attempt a
SET finished_at = now(), outcome = $4,
    error_type = $6, error_message = $7, error_traceback = $8
FROM finished f
WHERE a.queue = f.queue AND a.message_id = f.message_id AND a.attempt = f.attempts
RETURNING 1;

-- name: schedule_retry
-- Attempt $3 failed and will be retried after $4 seconds.
WITH retrying AS (
    UPDATE rabbitretry.ledger
    SET status = 'retrying', next_retry_at = now() + make_interval(secs => $4),
        retry_copy_confirmed = false, lease_until = NULL, updated_at = now(),
        error_type = $5, error_message = $6, error_traceback = $7, error_fingerprint = $8
    WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
    RETURNING queue, message_id, attempts, next_retry_at
), logged AS (
    UPDATE rabbitretry.attempt a
    SET finished_at = now(), outcome = 'retry', error_type = $5, error_message = $6,
        error_traceback = $7, retry_at = r.next_retry_at
    FROM retrying r
    WHERE a.queue = r.queue AND a.message_id = r.message_id AND a.attempt = r.attempts
)
SELECT extract(epoch FROM next_retry_at - now())::float8 AS wait_seconds FROM retrying;

-- name: confirm_retry_copy
-- The delay copy for attempt $3's retry is on the broker: older copies may now be dropped.
UPDATE rabbitretry.ledger SET retry_copy_confirmed = true
WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'retrying';

-- name: interrupt_attempt
-- A shutdown stopped attempt $3: it does not count, and the message is due again at once.
WITH requeued AS (
    UPDATE rabbitretry.ledger
    SET status = 'retrying', next_retry_at = now(), retry_copy_confirmed = false,
        lease_until = NULL, attempts_forgiven = attempts_forgiven + 1, updated_at = now()
    WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
    RETURNING queue, message_id, attempts
)
UPDATE rabbitretry.attempt a
SET finished_at = now(), outcome = 'interrupted', error_type = 'Interrupted',
    error_message = 'the worker shut down during the attempt; it is not counted'
FROM requeued r
WHERE a.queue = r.queue AND a.message_id = r.message_id AND a.attempt = r.attempts
RETURNING 1;

-- name: release_claim
-- A claim whose reply was lost with the connection: if worker $3 holds the key's open attempt,
-- that attempt is interrupted (not counted) and the message is due again at once.
WITH mine AS (
    SELECT l.queue, l.message_id, l.attempts
    FROM rabbitretry.ledger l
    JOIN rabbitretry.attempt a
      ON a.queue = l.queue AND a.message_id = l.message_id AND a.attempt = l.attempts
    WHERE l.queue = $1 AND l.message_id = $2 AND l.status = 'processing'
      AND a.worker = $3 AND a.outcome IS NULL
    FOR UPDATE OF l
), requeued AS (
    UPDATE rabbitretry.ledger l
    SET status = 'retrying', next_retry_at = now(), retry_copy_confirmed = false,
        lease_until = NULL, attempts_forgiven = attempts_forgiven + 1, updated_at = now()
    FROM mine m
    WHERE l.queue = m.queue AND l.message_id = m.message_id AND l.attempts = m.attempts
    RETURNING l.queue, l.message_id, l.attempts
)
UPDATE rabbitretry.attempt a
SET finished_at = now(), outcome = 'interrupted', error_type = 'Interrupted',
    error_message = 'the claim''s reply was lost with the connection; it is not counted'
FROM requeued r
WHERE a.queue = r.queue AND a.message_id = r.message_id AND a.attempt = r.attempts
RETURNING 1;

-- name: record_rejected
-- A delivery refused before any attempt (no message_id, too large): stored dead. A replayed
-- copy refused again (its row is retrying) goes back to dead; any other existing row is left
-- alone and nothing is returned: the copy is a duplicate.
INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts, max_attempts, reason,
                                     error_type, error_message, error_fingerprint, finished_at,
                                     payload, headers, properties, exchange, routing_key)
VALUES ($1, $2, 'dead', 0, $3, $4, $5, $6, $7, now(), $8, $9, $10, $11, $12)
ON CONFLICT (queue, message_id) DO UPDATE
SET status = 'dead', reason = excluded.reason, error_type = excluded.error_type,
    error_message = excluded.error_message, error_fingerprint = excluded.error_fingerprint,
    finished_at = now(), updated_at = now(), next_retry_at = NULL
WHERE l.status = 'retrying'
RETURNING 1;

-- name: get_entry
SELECT * FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2;

-- name: find_entries
-- All ledger rows with this message_id, in any queue.
SELECT * FROM rabbitretry.ledger WHERE message_id = $1 ORDER BY queue;

-- name: list_attempts
SELECT * FROM rabbitretry.attempt WHERE queue = $1 AND message_id = $2 ORDER BY attempt;

-- name: list_audit
SELECT * FROM rabbitretry.audit WHERE queue = $1 AND message_id = $2 ORDER BY at, id;

-- name: lock_dead
-- One dead letter, locked for a replay: a second replay waits, then finds it no longer dead.
SELECT * FROM rabbitretry.ledger
WHERE queue = $1 AND message_id = $2 AND status = 'dead'
FOR UPDATE;

-- name: mark_replayed
-- Gives a dead letter a fresh attempt budget; its copy is already confirmed on the work queue.
UPDATE rabbitretry.ledger
SET status = 'retrying', next_retry_at = now(), retry_copy_confirmed = true,
    attempts_forgiven = attempts, replays = replays + 1, finished_at = NULL, reason = NULL,
    updated_at = now()
WHERE queue = $1 AND message_id = $2 AND status = 'dead';

-- name: ledger_stats
SELECT queue, status, count(*) AS messages, sum(attempts) AS attempts,
       min(first_seen) AS oldest
FROM rabbitretry.ledger GROUP BY queue, status ORDER BY queue, status;

-- name: outbox_enqueue
INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, ordering_key, payload,
                                headers, content_type)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id;

-- name: outbox_notify
SELECT pg_notify('rabbitretry_outbox', '');

-- name: outbox_take
-- Pending rows that are due, locked for this relay; a row waits while an older row with the
-- same ordering key is still pending, so messages of one key leave in order.
SELECT id, exchange, routing_key, message_id, payload, headers, content_type, tries
FROM rabbitretry.outbox o
WHERE o.status = 'pending' AND o.next_try_at <= now()
  AND (o.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM rabbitretry.outbox older
        WHERE older.ordering_key = o.ordering_key AND older.status = 'pending'
          AND older.id < o.id))
ORDER BY o.next_try_at, o.id
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: outbox_sent
UPDATE rabbitretry.outbox SET status = 'sent', sent_at = now(), tries = tries + 1,
                              last_error = NULL
WHERE id = ANY($1::bigint[]);

-- name: outbox_failed_try
-- A try failed: back off, or give up after $3 tries (status failed, kept for people to see).
UPDATE rabbitretry.outbox
SET tries = tries + 1, last_error = $2,
    status = CASE WHEN tries + 1 >= $3 THEN 'failed' ELSE 'pending' END,
    next_try_at = now() + make_interval(secs => $4)
WHERE id = $1;

-- name: outbox_unpublishable
-- The row's message cannot be encoded as AMQP ($2 says why): failed at once, as no try can
-- succeed. A failed row no longer holds back later rows of its ordering key.
UPDATE rabbitretry.outbox SET status = 'failed', tries = tries + 1, last_error = $2
WHERE id = $1;

-- name: outbox_stats
SELECT status, count(*) AS messages, min(created_at) AS oldest, max(tries) AS most_tries
FROM rabbitretry.outbox GROUP BY status ORDER BY status;

-- name: outbox_list_failed
SELECT id, created_at, exchange, routing_key, message_id, tries, last_error
FROM rabbitretry.outbox WHERE status = 'failed' ORDER BY created_at DESC LIMIT $1;

-- name: outbox_retry_failed
-- Give failed rows another full set of tries (optionally one row).
UPDATE rabbitretry.outbox SET status = 'pending', tries = 0, next_try_at = now()
WHERE status = 'failed' AND ($1::bigint IS NULL OR id = $1)
RETURNING id;
