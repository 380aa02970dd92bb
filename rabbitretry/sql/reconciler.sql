-- The reconciler's scans and repairs (see rabbitretry/reconciler.py). Every scan takes a
-- bounded batch with FOR UPDATE SKIP LOCKED and marks what it took in the same statement, so
-- that reconcilers running side by side never take the same row.

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
-- retry waiting for its turn, or an attempt whose worker died (its attempt is logged crashed).
-- Returns 1 when the row was skipped, 0 when it had moved on meanwhile.
WITH skipped AS (
    UPDATE rabbitretry.ledger
    SET status = 'skipped', reason = $3, finished_at = now(), updated_at = now(),
        next_retry_at = NULL, lease_until = NULL
    WHERE queue = $1 AND message_id = $2
      AND (status = 'retrying' OR (status = 'processing' AND lease_until < now()))
    RETURNING queue, message_id, attempts
), crashed AS (
    UPDATE rabbitretry.attempt a
    SET finished_at = now(), outcome = 'crashed', error_type = 'WorkerLost',
        error_message = 'the worker stopped renewing its lease before the attempt finished'
    FROM skipped s
    WHERE a.queue = s.queue AND a.message_id = s.message_id AND a.attempt = s.attempts
      AND a.outcome IS NULL
)
SELECT count(*)::int FROM skipped;

-- name: reconcile_stuck_outbox
-- Outbox rows still pending $1 seconds after they were due (no relay is running, or it
-- stalled), in per-key order like outbox_take; at most $2, locked until the caller commits.
-- Served by outbox_pending_idx (status = 'pending', next_try_at, id).
SELECT id, exchange, routing_key, message_id, payload, headers, content_type, tries
FROM rabbitretry.outbox o
WHERE o.status = 'pending' AND o.next_try_at < now() - make_interval(secs => $1)
  AND (o.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM rabbitretry.outbox older
        WHERE older.ordering_key = o.ordering_key AND older.status = 'pending'
          AND older.id < o.id))
ORDER BY o.next_try_at, o.id
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: reconcile_key_statuses
-- The ledger status of each of the keys $2 in queue $1 (keys never seen have no row).
SELECT message_id, status FROM rabbitretry.ledger
WHERE queue = $1 AND message_id = ANY($2::text[]);

-- name: reconcile_orphans
-- Keys of queue $1 that succeeded in [$2, $3) but are not among the expected keys $4: how
-- many, and the first $5 of them. Served by ledger_succeeded_idx.
SELECT message_id, count(*) OVER ()::int AS total
FROM rabbitretry.ledger
WHERE status = 'succeeded' AND queue = $1 AND finished_at >= $2 AND finished_at < $3
  AND message_id <> ALL($4::text[])
ORDER BY finished_at
LIMIT $5;

-- name: reconcile_claim_republish
-- Of the missing keys $2 of queue $1, those this reconciler may re-publish now: never
-- re-published, or not within the last $4 seconds (doubling with each re-publication, up to
-- 64 × $4). The row is the claim, so two reconcilers never re-publish the same key at once.
INSERT INTO rabbitretry.reconciler_republished AS r (queue, message_id, reconciliation)
SELECT $1, key, $3 FROM unnest($2::text[]) AS key
ON CONFLICT (queue, message_id) DO UPDATE
SET republished_at = now(), times = r.times + 1, reconciliation = excluded.reconciliation
WHERE r.republished_at < now() - make_interval(secs => $4 * 2 ^ least(r.times - 1, 6))
RETURNING message_id;

-- name: reconcile_forget_republished
-- Re-publications of reconciliation $1 older than its look-back ($2 seconds): their keys are
-- outside every window it still checks, so the claim rows have done their work.
DELETE FROM rabbitretry.reconciler_republished
WHERE reconciliation = $1 AND republished_at < now() - make_interval(secs => $2);
