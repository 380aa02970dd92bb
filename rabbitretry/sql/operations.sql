-- Operator queries shared by the CLI and the console (see rabbitretry/operations/): the
-- selections, the replay targets and the audit. The ledger writes of an operator's actions are
-- in operator.sql, run by rabbitretry/ledger/operator.py.
-- Filters are optional: a NULL parameter does not narrow. "when" is the moment a message last
-- changed state: finished_at for finished rows, updated_at otherwise.

-- name: operations_list
-- $1 statuses, $2 queue, $3 error type or reason, $4 fingerprint, $5 since, $6 until,
-- $7 text (searched in the key, error type and error message), $8 limit.
SELECT queue, message_id, status, attempts, max_attempts, reason, error_type, error_message,
       error_fingerprint, first_seen, finished_at, next_retry_at, replays,
       coalesce(finished_at, updated_at) AS changed_at
FROM rabbitretry.ledger
WHERE rabbitretry.operator_filter(ledger, $1::text[], $2::text, $3::text, $4::text,
                                 $5::timestamptz, $6::timestamptz, $7::text)
ORDER BY coalesce(finished_at, updated_at) DESC, queue, message_id
LIMIT $8;

-- name: operations_groups
-- The same filters, grouped by error fingerprint: how many, first and last seen, one example.
SELECT queue, error_fingerprint AS fingerprint,
       min(coalesce(error_type, reason)) AS error_type,
       min(coalesce(error_message, reason, '')) AS example_message,
       count(*) AS messages,
       min(coalesce(finished_at, updated_at)) AS first_seen,
       max(coalesce(finished_at, updated_at)) AS last_seen
FROM rabbitretry.ledger
WHERE rabbitretry.operator_filter(ledger, $1::text[], $2::text, $3::text, $4::text,
                                 $5::timestamptz, $6::timestamptz, $7::text)
GROUP BY queue, error_fingerprint
ORDER BY count(*) DESC, max(coalesce(finished_at, updated_at)) DESC
LIMIT $8;

-- name: operations_replay_targets
-- Dead letters a replay applies to, oldest death first: $1 keys as "queue/message_id" text
-- (NULL: any), $2 queue, $3 fingerprint, $4 error type or reason, $5 died at or before,
-- $6 at most this many (NULL: all of them, whatever their number).
SELECT queue, message_id, error_fingerprint, finished_at
FROM rabbitretry.ledger
WHERE status = 'dead'
  AND ($1::text[] IS NULL OR queue || '/' || message_id = ANY($1::text[]))
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR error_fingerprint = $3)
  AND ($4::text IS NULL OR error_type = $4 OR reason = $4)
  AND ($5::timestamptz IS NULL OR finished_at <= $5)
ORDER BY finished_at, queue, message_id
LIMIT $6;

-- name: operations_audit
-- $8: the replay of many messages this row is one message of (NULL: an operation of its own).
INSERT INTO rabbitretry.audit (actor, action, queue, message_id, detail, messages, comment,
                               batch)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id;

-- name: operations_recent_audit
-- The latest audit rows, one per operation: an action on many messages is its summary row
-- (replay-batch, ignore-batch, ...), not one row per message ($2 true: every row).
SELECT id, at, actor, action, queue, message_id, detail, messages, comment, batch
FROM rabbitretry.audit
WHERE $2 OR batch IS NULL OR action LIKE '%-batch'
ORDER BY at DESC, id DESC
LIMIT $1;

-- name: operations_export
-- Everything about the matching messages, for a jsonl export (same filters as operations_list).
SELECT queue, message_id, status, attempts, reason, error_type, error_message,
       error_fingerprint, first_seen, finished_at, payload, headers, properties, exchange,
       routing_key, replays
FROM rabbitretry.ledger
WHERE rabbitretry.operator_filter(ledger, $1::text[], $2::text, $3::text, $4::text,
                                 $5::timestamptz, $6::timestamptz, $7::text)
ORDER BY coalesce(finished_at, updated_at), queue, message_id
LIMIT $8;

-- name: find_entries
-- All ledger rows with this message_id, in any queue.
SELECT * FROM rabbitretry.ledger WHERE message_id = $1 ORDER BY queue;

-- name: compacted_key
-- When the compacted message (queue $1, message_id $2) succeeded, and its attempts; no row for
-- a key that is not compacted.
SELECT finished_at, attempts FROM rabbitretry.succeeded_key
WHERE key_hash = rabbitretry.key_hash($1, $2);

-- name: list_attempts
SELECT * FROM rabbitretry.attempt_history WHERE queue = $1 AND message_id = $2 ORDER BY attempt;

-- name: list_audit
SELECT * FROM rabbitretry.audit WHERE queue = $1 AND message_id = $2 ORDER BY at, id;

-- name: lock_dead
-- One dead letter, locked for a replay: a second replay waits, then finds it no longer dead.
-- Its state is tested with IS NOT DISTINCT FROM (the same test: a status is never NULL),
-- which the planner cannot match to the predicate of ledger_dead_idx, so the row is found by
-- its key. Said `status = 'dead'`, it was planned as a scan of that index over the whole
-- queue whenever the statistics counted few dead letters there, as when a burst of deaths
-- follows one that was replayed and analyzed but not yet vacuumed: 68 ms and 5,300 buffers
-- per dead letter of a burst of 100,000, against 0.06 ms and 5 by key. The other statements
-- that name a dead letter do the same.
SELECT * FROM rabbitretry.ledger
WHERE queue = $1 AND message_id = $2 AND status IS NOT DISTINCT FROM 'dead'
FOR UPDATE;
