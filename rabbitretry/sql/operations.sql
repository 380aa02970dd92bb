-- Operator queries shared by the CLI and the console (see rabbitretry/operations.py).
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

-- name: operations_ignore
-- A dead or retrying message no one will retry: its copies are dropped when they arrive.
UPDATE rabbitretry.ledger l
SET status = 'ignored', next_retry_at = NULL, lease_until = NULL,
    finished_at = now(), updated_at = now()
FROM (SELECT status FROM rabbitretry.ledger
      WHERE queue = $1 AND message_id = $2 FOR UPDATE) AS before
WHERE l.queue = $1 AND l.message_id = $2 AND l.status IN ('dead', 'retrying')
RETURNING before.status AS status_before;

-- name: operations_set_payload
-- The payload of a locked dead letter, replaced by an operator before its replay.
UPDATE rabbitretry.ledger SET payload = $3, updated_at = now()
WHERE queue = $1 AND message_id = $2 AND status = 'dead';

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

-- name: operations_ignore_many
-- Dead letters ($1 queues, $2 keys, pairwise) no one will retry, in one statement: each gets
-- an audit row of batch $5 that keeps when it died, so the batch can be undone.
WITH chosen AS (
    SELECT l.queue, l.message_id, l.finished_at
    FROM rabbitretry.ledger l
    JOIN unnest($1::text[], $2::text[]) AS k (queue, message_id)
      ON l.queue = k.queue AND l.message_id = k.message_id
    WHERE l.status = 'dead'
    FOR UPDATE OF l
), ignored AS (
    UPDATE rabbitretry.ledger l
    SET status = 'ignored', next_retry_at = NULL, lease_until = NULL,
        finished_at = now(), updated_at = now()
    FROM chosen c
    WHERE l.queue = c.queue AND l.message_id = c.message_id
    RETURNING l.queue, l.message_id, c.finished_at AS died_at
)
INSERT INTO rabbitretry.audit (actor, action, queue, message_id, detail, messages, comment, batch)
SELECT $3, 'ignore', queue, message_id,
       jsonb_build_object('status_before', 'dead', 'died_at', died_at), 1, $4, $5
FROM ignored;

-- name: operations_unignore_batch
-- Undo of batch $1: its messages still ignored are dead again (with their time of death),
-- each with an audit row of batch $4 (actor $2, comment $3).
WITH undone AS (
    UPDATE rabbitretry.ledger l
    SET status = 'dead', finished_at = coalesce((a.detail ->> 'died_at')::timestamptz, now()),
        updated_at = now()
    FROM rabbitretry.audit a
    WHERE a.batch = $1 AND a.action = 'ignore'
      AND l.queue = a.queue AND l.message_id = a.message_id AND l.status = 'ignored'
    RETURNING l.queue, l.message_id
)
INSERT INTO rabbitretry.audit (actor, action, queue, message_id, detail, messages, comment, batch)
SELECT $2, 'unignore', queue, message_id, jsonb_build_object('undoes', $1::text), 1, $3, $4
FROM undone;
