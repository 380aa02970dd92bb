-- Service levels and metrics read from the ledger (see rabbitretry/monitoring/levels.py,
-- metrics.py and rabbitretry/cli/status.py).

-- name: status_queues
-- Every queue the ledger knows, one index probe per queue (a loose index scan).
WITH RECURSIVE q AS (
    (SELECT queue FROM rabbitretry.ledger ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT l.queue FROM rabbitretry.ledger l WHERE l.queue > q.queue
            ORDER BY l.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL;

-- name: status_latency
-- Per queue, over the last $1 seconds: messages finished (succeeded or skipped), p95 and p99
-- of publish (or first seen) to finish, and how many finished after more than $2 retries.
SELECT queue,
       count(*) FILTER (WHERE status <> 'dead') AS finished,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency)
           FILTER (WHERE status <> 'dead') AS p95,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY latency)
           FILTER (WHERE status <> 'dead') AS p99,
       count(*) FILTER (WHERE attempts - 1 > $2) AS retried
FROM (
    SELECT queue, status, attempts,
           greatest(0, extract(epoch FROM finished_at - coalesce(
               to_timestamp((properties ->> 'timestamp')::float8), first_seen)))::float8
               AS latency
    FROM rabbitretry.ledger
    WHERE status IN ('succeeded', 'skipped', 'dead')
      AND finished_at >= now() - make_interval(secs => $1)
) recent
GROUP BY queue;

-- name: status_unfinished
-- Per queue and status, the messages retrying, processing or dead, and how many of those not
-- yet dead have been retried more than $1 times. One branch per status, so that each is served
-- by that status's partial index rather than a scan of the whole ledger.
SELECT queue, status, count(*) AS messages,
       count(*) FILTER (WHERE status <> 'dead' AND attempts - 1 > $1) AS retried
FROM (
    SELECT queue, status, attempts FROM rabbitretry.ledger
    WHERE status = 'retrying' AND next_retry_at IS NOT NULL
    UNION ALL
    SELECT queue, status, attempts FROM rabbitretry.ledger
    WHERE status = 'processing' AND lease_until IS NOT NULL
    UNION ALL
    SELECT queue, status, attempts FROM rabbitretry.ledger WHERE status = 'dead'
) unfinished
GROUP BY queue, status;

-- name: status_outbox
-- The outbox backlog: rows by status (pending, failed) and the oldest pending one's age.
SELECT status, count(*) AS messages,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds
FROM rabbitretry.outbox
WHERE status IN ('pending', 'failed')
GROUP BY status;

-- name: status_first_seen
SELECT first_seen FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2;

-- name: status_now
SELECT now();
