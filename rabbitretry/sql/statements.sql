-- The statements of one delivery's attempts and the ledger's reads (see
-- rabbitretry/ledger/statements.py), loaded by name (rabbitretry/db.py). Parameters are
-- positional ($1, $2, ...); each block starts with a "-- name:" line.

-- name: claim
SELECT verdict, attempt, budget_attempt, wait_seconds, status
FROM rabbitretry.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: mark_started
-- Attempt $3 is marked started (its handler has run a moment, or our own code failed after
-- the claim): from here on it counts even if its worker dies (close_lapsed_attempt).
-- Committed without waiting for its WAL flush, like the claim: the attempt's final write
-- flushes it, and only a database crash can lose it (the attempt is then not counted, as a
-- claim lost in that crash is not). No row: the attempt is not ours.
UPDATE rabbitretry.ledger
SET handler_started_at = clock_timestamp()
WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
RETURNING set_config('synchronous_commit', 'off', true) AS commit_mode;

-- name: renew_lease
-- Extends the lease of a running attempt; no row means the attempt is no longer ours.
UPDATE rabbitretry.ledger
SET lease_until = now() + make_interval(secs => $4)
WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
RETURNING 1;

-- name: finish_attempt
-- Closes attempt $3 of a key as succeeded, dead or skipped: the ledger row says so, and a dead
-- or skipped attempt is appended to the attempt log in the same statement (a success is the
-- ledger row alone). No row returned means the attempt had lost its lease to another one.
-- $10: keep the snapshot of a succeeded message (its consumer's keep_payload = "always");
-- without it, of the properties only the publish time stays (what `rabbitretry status`
-- measures from).
WITH finished AS (
    UPDATE rabbitretry.ledger
    SET status = $4, reason = $5, error_type = $6, error_message = $7, error_traceback = $8,
        error_fingerprint = $9, finished_at = now(), updated_at = now(),
        lease_until = NULL, next_retry_at = NULL,
        payload = CASE WHEN $4 = 'succeeded' AND NOT $10 THEN NULL ELSE payload END,
        headers = CASE WHEN $4 = 'succeeded' AND NOT $10 THEN NULL ELSE headers END,
        properties = CASE
            WHEN $4 <> 'succeeded' OR $10 THEN properties
            WHEN properties ? 'timestamp'
            THEN jsonb_build_object('timestamp', properties -> 'timestamp')
        END
    WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
    RETURNING queue, message_id, attempts, worker, attempt_started_at, handler_started_at
), logged AS (
    INSERT INTO rabbitretry.attempt (queue, message_id, attempt, started_at, finished_at,
                                     outcome, error_type, error_message, error_traceback,
                                     worker, handler_started_at)
    SELECT queue, message_id, attempts, coalesce(attempt_started_at, now()), now(), $4, $6, $7,
           $8, coalesce(worker, 'unknown'), handler_started_at
    FROM finished WHERE $4 <> 'succeeded'
)
SELECT 1 FROM finished;

-- name: schedule_retry
-- Attempt $3 failed and will be retried after $4 seconds ($9: the downstream whose failure it
-- was, if any: the attempt is forgiven if its breaker counts the failure as part of an outage).
WITH retrying AS (
    UPDATE rabbitretry.ledger
    SET status = 'retrying', next_retry_at = now() + make_interval(secs => $4),
        retry_copy_confirmed = false, lease_until = NULL, updated_at = now(),
        error_type = $5, error_message = $6, error_traceback = $7, error_fingerprint = $8
    WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
    RETURNING queue, message_id, attempts, next_retry_at, worker, attempt_started_at,
              handler_started_at
), logged AS (
    INSERT INTO rabbitretry.attempt (queue, message_id, attempt, started_at, finished_at,
                                     outcome, error_type, error_message, error_traceback,
                                     retry_at, worker, handler_started_at, downstream)
    SELECT queue, message_id, attempts, coalesce(attempt_started_at, now()), now(), 'retry',
           $5, $6, $7, next_retry_at, coalesce(worker, 'unknown'), handler_started_at, $9
    FROM retrying
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
    RETURNING queue, message_id, attempts, worker, attempt_started_at, handler_started_at
)
INSERT INTO rabbitretry.attempt (queue, message_id, attempt, started_at, finished_at, outcome,
                                 error_type, error_message, worker, handler_started_at)
SELECT queue, message_id, attempts, coalesce(attempt_started_at, now()), now(), 'interrupted',
       'Interrupted', 'the worker shut down during the attempt; it is not counted',
       coalesce(worker, 'unknown'), handler_started_at
FROM requeued
RETURNING 1;

-- name: defer_attempt
-- Attempt $3 met downstream $4 unavailable (its breaker is open): it does not count, and the
-- message is due again at once; its delivery goes back to the queue and waits there.
WITH deferred AS (
    UPDATE rabbitretry.ledger
    SET status = 'retrying', next_retry_at = now(), retry_copy_confirmed = false,
        lease_until = NULL, attempts_forgiven = attempts_forgiven + 1, updated_at = now(),
        error_type = $5, error_message = $6, error_traceback = $7, error_fingerprint = $8
    WHERE queue = $1 AND message_id = $2 AND attempts = $3 AND status = 'processing'
    RETURNING queue, message_id, attempts, worker, attempt_started_at, handler_started_at
)
INSERT INTO rabbitretry.attempt (queue, message_id, attempt, started_at, finished_at, outcome,
                                 error_type, error_message, error_traceback, worker,
                                 handler_started_at, downstream)
SELECT queue, message_id, attempts, coalesce(attempt_started_at, now()), now(), 'deferred', $5,
       $6, $7, coalesce(worker, 'unknown'), handler_started_at, $4
FROM deferred
RETURNING 1;

-- name: release_claim
-- A claim whose reply was lost with the connection: if worker $3 holds the key's open attempt,
-- that attempt is interrupted (not counted) and the message is due again at once.
WITH requeued AS (
    UPDATE rabbitretry.ledger
    SET status = 'retrying', next_retry_at = now(), retry_copy_confirmed = false,
        lease_until = NULL, attempts_forgiven = attempts_forgiven + 1, updated_at = now()
    WHERE queue = $1 AND message_id = $2 AND status = 'processing' AND worker = $3
    RETURNING queue, message_id, attempts, worker, attempt_started_at, handler_started_at
)
INSERT INTO rabbitretry.attempt (queue, message_id, attempt, started_at, finished_at, outcome,
                                 error_type, error_message, worker, handler_started_at)
SELECT queue, message_id, attempts, coalesce(attempt_started_at, now()), now(), 'interrupted',
       'NotStarted', 'the claim''s reply was lost with the connection; it is not counted',
       worker, handler_started_at
FROM requeued
RETURNING 1;

-- name: record_rejected
-- A delivery refused before any attempt, stored dead (rabbitretry.record_rejected): 1 when
-- stored, nothing for a duplicate.
SELECT * FROM rabbitretry.record_rejected($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);

-- name: get_entry
SELECT * FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2;

-- name: ledger_stats
-- Per queue and status; compacted keys, whose queue is not kept, on a line of their own
-- (queue NULL; oldest: when the oldest finished).
SELECT queue, status, count(*) AS messages, sum(attempts) AS attempts,
       min(first_seen) AS oldest
FROM rabbitretry.ledger GROUP BY queue, status
UNION ALL
SELECT NULL, 'succeeded, compacted', count(*), sum(attempts), min(finished_at)
FROM rabbitretry.succeeded_key HAVING count(*) > 0
ORDER BY queue NULLS LAST, status;
