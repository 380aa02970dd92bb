-- Retention: what `rabbitretry ledger prune` removes (finished messages, sent outbox rows,
-- sent alerts and callback receipts). Dead rows are never removed; neither are
-- rows still in flight. These scans are not indexed on purpose: pruning is rare maintenance, and
-- an index on finished_at would cost every finished message on the hot path.

-- name: prune_ledger
-- One batch of finished rows (succeeded, skipped, ignored) that ended before $1; their attempt
-- rows go with them (ON DELETE CASCADE). Audit rows are kept.
WITH doomed AS (
    SELECT queue, message_id FROM rabbitretry.ledger
    WHERE status IN ('succeeded', 'skipped', 'ignored') AND finished_at < $1
    LIMIT $2
), deleted AS (
    DELETE FROM rabbitretry.ledger l USING doomed d
    WHERE l.queue = d.queue AND l.message_id = d.message_id
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
-- What a prune before $1 would remove, per table.
SELECT 'ledger' AS what, count(*) AS rows FROM rabbitretry.ledger
WHERE status IN ('succeeded', 'skipped', 'ignored') AND finished_at < $1
UNION ALL
SELECT 'outbox', count(*) FROM rabbitretry.outbox WHERE status = 'sent' AND sent_at < $1
UNION ALL
SELECT 'alerts', count(*) FROM rabbitretry.alert WHERE status = 'sent' AND sent_at < $1
UNION ALL
SELECT 'callback_receipts', count(*) FROM rabbitretry.callback_receipt WHERE received_at < $1;
