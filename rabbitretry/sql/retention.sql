-- Retention: what `rabbitretry ledger prune` removes (finished messages, sent outbox rows,
-- sent alerts and callback receipts). Dead rows are never removed; neither are
-- rows still in flight. Succeeded rows, nearly all of a ledger, are found through the index the
-- reconciler's orphan check keeps anyway (ledger_succeeded_idx), queue by queue and oldest
-- first, each batch starting where the last one ended: a batch reads what it deletes, however
-- large the ledger, and deletes each row where the batch found it (its ctid), not through its
-- key, whose index a delete would otherwise walk again row by row (random pages for the
-- compacted keys' hashes: a batch of 5,000 took 21 ms that way, 8 ms by ctid). A row that
-- changed after the batch found it is a new version at another ctid, and is left alone. Skipped and ignored rows, few and written once, have an index of their own
-- (ledger_set_aside_idx); the other tables are small. Each DELETE checks a row's status and end
-- again: a row chosen for deletion that changed meanwhile (an operator's undo of an ignore
-- made it dead again) is left alone. Succeeded rows younger than the window but past the
-- compaction window are moved to rabbitretry.succeeded_key (their key's hash, end and attempts),
-- the same way, batch by batch.

-- name: ledger_queues
-- Every queue of the ledger, read from its primary key by skipping from one queue to the next.
WITH RECURSIVE queues AS (
    SELECT min(queue) AS queue FROM rabbitretry.ledger
    UNION ALL
    SELECT (SELECT min(l.queue) FROM rabbitretry.ledger l WHERE l.queue > q.queue)
    FROM queues q WHERE q.queue IS NOT NULL
)
SELECT queue FROM queues WHERE queue IS NOT NULL;

-- name: prune_succeeded
-- One batch of queue $1's succeeded rows that ended before $2, from $4 on (where the last
-- batch ended), oldest first: how many it took, how many went, and when the last it took
-- ended. Their attempt rows go with them (ON DELETE CASCADE). Audit rows are kept.
WITH doomed AS (
    SELECT ctid, finished_at FROM rabbitretry.ledger
    WHERE queue = $1 AND status = 'succeeded' AND finished_at >= $4 AND finished_at < $2
    ORDER BY finished_at
    LIMIT $3
), deleted AS (
    DELETE FROM rabbitretry.ledger l USING doomed d
    WHERE l.ctid = d.ctid AND l.status = 'succeeded' AND l.finished_at < $2
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed)::int AS taken, (SELECT count(*) FROM deleted)::int AS deleted,
       (SELECT max(finished_at) FROM doomed) AS last;

-- name: compact_succeeded
-- One batch of queue $1's succeeded rows that ended before $2, from $4 on, oldest first,
-- moved to rabbitretry.succeeded_key: how many it took, how many it moved, and when the last
-- it took ended. Their attempt rows go with them (ON DELETE CASCADE). Rows that keep their
-- snapshot (keep_payload = "always") are taken but stay whole, so that a batch never reads
-- more than it takes.
WITH chosen AS (
    SELECT ctid, finished_at, payload IS NULL AS compactable
    FROM rabbitretry.ledger
    WHERE queue = $1 AND status = 'succeeded' AND finished_at >= $4 AND finished_at < $2
    ORDER BY finished_at
    LIMIT $3
), moved AS (
    DELETE FROM rabbitretry.ledger l USING chosen c
    WHERE c.compactable AND l.ctid = c.ctid
      AND l.status = 'succeeded' AND l.finished_at < $2 AND l.payload IS NULL
    RETURNING l.queue, l.message_id, l.finished_at, l.attempts
), kept AS (
    INSERT INTO rabbitretry.succeeded_key (key_hash, finished_at, attempts)
    SELECT rabbitretry.key_hash(queue, message_id), finished_at, attempts FROM moved
    ON CONFLICT (key_hash) DO NOTHING
), known AS (
    INSERT INTO rabbitretry.compacted_queue AS q (queue, last_finished_at)
    SELECT $1, max(finished_at) FROM moved HAVING count(*) > 0
    ON CONFLICT (queue) DO UPDATE
    SET last_finished_at = greatest(q.last_finished_at, excluded.last_finished_at)
)
SELECT (SELECT count(*) FROM chosen)::int AS taken, (SELECT count(*) FROM moved)::int AS deleted,
       (SELECT max(finished_at) FROM chosen) AS last;

-- name: prune_succeeded_keys
-- One batch of compacted keys that ended before $1, from $3 on, oldest first: how many it
-- took, how many went, and when the last it took ended.
WITH doomed AS (
    SELECT ctid, finished_at FROM rabbitretry.succeeded_key
    WHERE finished_at >= $3 AND finished_at < $1
    ORDER BY finished_at
    LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.succeeded_key s USING doomed d
    WHERE s.ctid = d.ctid AND s.finished_at < $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed)::int AS taken, (SELECT count(*) FROM deleted)::int AS deleted,
       (SELECT max(finished_at) FROM doomed) AS last;

-- name: prune_compacted_queues
-- The compacted queues whose every key ended before $1 (at most $2 of them a batch).
WITH doomed AS (
    SELECT queue FROM rabbitretry.compacted_queue WHERE last_finished_at < $1 LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.compacted_queue q USING doomed d
    WHERE q.queue = d.queue AND q.last_finished_at < $1
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: prune_ledger
-- One batch of the other finished rows (skipped, ignored) that ended before $1, with their
-- attempt rows.
WITH doomed AS (
    SELECT queue, message_id FROM rabbitretry.ledger
    WHERE status IN ('skipped', 'ignored') AND finished_at < $1
    LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.ledger l USING doomed d
    WHERE l.queue = d.queue AND l.message_id = d.message_id
      AND l.status IN ('skipped', 'ignored') AND l.finished_at < $1
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: prune_outbox
-- One batch of outbox rows sent before $1.
WITH doomed AS (
    SELECT id FROM rabbitretry.outbox WHERE status = 'sent' AND sent_at < $1 LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.outbox o USING doomed d WHERE o.id = d.id RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: prune_alerts
-- One batch of alerts sent before $1 (open and pending ones are never removed).
WITH doomed AS (
    SELECT id FROM rabbitretry.alert WHERE status = 'sent' AND sent_at < $1 LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.alert a USING doomed d WHERE a.id = d.id RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: prune_callback_receipts
-- One batch of callback receipts received before $1: a retry of such a callback is stored again
-- (and dropped by the consumer's ledger while that still remembers the key).
WITH doomed AS (
    SELECT kind, message_id FROM rabbitretry.callback_receipt WHERE received_at < $1 LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.callback_receipt r USING doomed d
    WHERE r.kind = d.kind AND r.message_id = d.message_id
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: prunable
-- What a prune before $1 would remove, per table, and what it would compact (succeeded before
-- $2; NULL: nothing).
SELECT 'ledger' AS what, count(*) AS rows FROM rabbitretry.ledger
WHERE status IN ('succeeded', 'skipped', 'ignored') AND finished_at < $1
UNION ALL
SELECT 'succeeded_keys', count(*) FROM rabbitretry.succeeded_key WHERE finished_at < $1
UNION ALL
SELECT 'compacted', count(*) FROM rabbitretry.ledger
WHERE status = 'succeeded' AND payload IS NULL AND finished_at >= $1 AND finished_at < $2
UNION ALL
SELECT 'outbox', count(*) FROM rabbitretry.outbox WHERE status = 'sent' AND sent_at < $1
UNION ALL
SELECT 'alerts', count(*) FROM rabbitretry.alert WHERE status = 'sent' AND sent_at < $1
UNION ALL
SELECT 'callback_receipts', count(*) FROM rabbitretry.callback_receipt WHERE received_at < $1;
