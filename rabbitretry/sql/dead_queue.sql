-- The reconciler's scan of the dead-letter queues (see rabbitretry/reconcile/dead_queue.py);
-- recording what it finds dead is dead_queue_record, in repairs.sql.

-- name: dead_queue_ledger_queues
-- Every queue the ledger has a row for (a loose index scan over the primary key, one probe per
-- queue however many rows each holds), or compacted keys of.
WITH RECURSIVE queues (queue) AS (
    (SELECT queue FROM rabbitretry.ledger ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT l.queue FROM rabbitretry.ledger l
            WHERE l.queue > q.queue ORDER BY l.queue LIMIT 1)
    FROM queues q
    WHERE q.queue IS NOT NULL
)
SELECT queue FROM queues WHERE queue IS NOT NULL
UNION
SELECT queue FROM rabbitretry.compacted_queue;
