-- The console's own state (see rabbitretry/console/ and migrations/0008_console.sql).

-- name: console_revoke
-- A logged-out session ($1 nonce) stays refused until its cookie would have expired ($2).
WITH pruned AS (DELETE FROM rabbitretry.console_revoked WHERE expires_at < now())
INSERT INTO rabbitretry.console_revoked (nonce, expires_at) VALUES ($1, $2)
ON CONFLICT (nonce) DO NOTHING;

-- name: console_is_revoked
SELECT EXISTS (SELECT 1 FROM rabbitretry.console_revoked WHERE nonce = $1);

-- name: console_job_save
-- A background replay's state: inserted when it starts, rewritten while it runs and when done.
INSERT INTO rabbitretry.console_job (id, title, actor, report, started_at, done, error)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (id) DO UPDATE
SET report = excluded.report, done = excluded.done, error = excluded.error, updated_at = now();

-- name: console_job_get
SELECT id, title, actor, report, started_at, updated_at, done, error
FROM rabbitretry.console_job WHERE id = $1;

-- name: console_jobs_recent
SELECT id, title, actor, report, started_at, updated_at, done, error
FROM rabbitretry.console_job ORDER BY started_at DESC LIMIT $1;

-- name: console_overview_queues
-- Per queue: dead, retrying and processing messages, and the oldest dead letter. One branch
-- per status, each served by that status's partial index.
SELECT queue,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'retrying') AS retrying,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       min(finished_at) FILTER (WHERE status = 'dead') AS oldest_dead
FROM (
    SELECT queue, status, finished_at FROM rabbitretry.ledger WHERE status = 'dead'
    UNION ALL
    SELECT queue, status, NULL FROM rabbitretry.ledger
    WHERE status = 'retrying' AND next_retry_at IS NOT NULL
    UNION ALL
    SELECT queue, status, NULL FROM rabbitretry.ledger
    WHERE status = 'processing' AND lease_until IS NOT NULL
) unfinished
GROUP BY queue
ORDER BY queue;

-- name: console_overview_minutes
-- Per queue and minute over the last $1 minutes: messages handled (succeeded or skipped) and
-- messages that died, by the minute they finished in.
SELECT queue, date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status <> 'dead') AS handled,
       count(*) FILTER (WHERE status = 'dead') AS died
FROM rabbitretry.ledger
WHERE status IN ('succeeded', 'skipped', 'dead')
  AND finished_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1)
GROUP BY queue, minute;
