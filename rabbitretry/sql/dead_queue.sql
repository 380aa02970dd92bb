-- The reconciler's scan of the dead-letter queues (see rabbitretry/reconcile_dead_queue.py):
-- whatever the broker dead-lettered without a ledger row is recorded dead.

-- name: dead_queue_ledger_queues
-- Every queue the ledger has a row for: a loose index scan over the primary key, one probe per
-- queue however many rows each holds.
WITH RECURSIVE queues (queue) AS (
    (SELECT queue FROM rabbitretry.ledger ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT l.queue FROM rabbitretry.ledger l
            WHERE l.queue > q.queue ORDER BY l.queue LIMIT 1)
    FROM queues q
    WHERE q.queue IS NOT NULL
)
SELECT queue FROM queues WHERE queue IS NOT NULL;

-- name: dead_queue_record
-- Messages taken off work queue $1's dead-letter queue, stored dead with reason $3 (also their
-- error type) and max_attempts $2, unless the ledger already has their key: any existing row,
-- terminal or still in flight, is left exactly as it is (the ledger decides). The keys inserted
-- are returned. Two copies of one key in a batch make one row; keys are inserted in order, so
-- reconcilers recording overlapping batches at once cannot deadlock. Every insert raises the
-- dead-letter alert through the ledger_alert_on_dead trigger.
INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts, max_attempts, reason,
                                     error_type, error_message, error_fingerprint, finished_at,
                                     payload, headers, properties, exchange, routing_key)
SELECT DISTINCT ON (m.message_id)
       $1, m.message_id, 'dead', 0, $2, $3, $3, m.error_message, m.fingerprint, now(),
       m.payload, m.headers, m.properties, m.exchange, m.routing_key
FROM unnest($4::text[], $5::bytea[], $6::jsonb[], $7::jsonb[], $8::text[], $9::text[],
            $10::text[], $11::text[])
     AS m (message_id, payload, headers, properties, exchange, routing_key, error_message,
           fingerprint)
ORDER BY m.message_id
ON CONFLICT (queue, message_id) DO NOTHING
RETURNING l.message_id;
