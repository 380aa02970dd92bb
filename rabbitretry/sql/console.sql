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

-- The console's lists, a keyset page at a time (see rabbitretry/console/listing.py).
-- $1-$7 the filter of operations_list; $8 rows (NULL: all); $9 the sort column; $10 true for
-- descending; the cursor (the row before the page, NULL for the first page): its sort value
-- in the slot of its type ($11 time, $12 number, $13 text) and its tie ($14, $15). Exactly one
-- of sort_time, sort_number and sort_text is set, by $9, so comparing all three compares it.
-- "total" counts every match, whichever page this is.

-- name: console_messages_page
-- Not materialized: the page is a top-N sort of the matches and the total a count of them,
-- each planned on its own (materializing every matching row costs more than both).
WITH listed AS NOT MATERIALIZED (
    SELECT queue, message_id, status, attempts, max_attempts, reason, error_type, error_message,
           error_fingerprint, first_seen, finished_at, next_retry_at, replays,
           coalesce(finished_at, updated_at) AS changed_at,
           CASE $9 WHEN 'changed' THEN coalesce(finished_at, updated_at)
                   WHEN 'first_seen' THEN first_seen END AS sort_time,
           CASE $9 WHEN 'attempts' THEN attempts::bigint END AS sort_number,
           CASE $9 WHEN 'queue' THEN queue WHEN 'key' THEN message_id END AS sort_text,
           queue AS tie_1, message_id AS tie_2
    FROM rabbitretry.ledger
    WHERE rabbitretry.operator_filter(ledger, $1::text[], $2::text, $3::text, $4::text,
                                     $5::timestamptz, $6::timestamptz, $7::text)
)
SELECT *, (SELECT count(*) FROM listed) AS total FROM listed
WHERE rabbitretry.console_after(sort_time, sort_number, sort_text, tie_1, tie_2, $10::boolean,
                                $11::timestamptz, $12::bigint, $13::text, $14::text, $15::text)
ORDER BY CASE WHEN $10 THEN sort_time END DESC, CASE WHEN $10 THEN sort_number END DESC,
         CASE WHEN $10 THEN sort_text END DESC, CASE WHEN $10 THEN tie_1 END DESC,
         CASE WHEN $10 THEN tie_2 END DESC,
         sort_time, sort_number, sort_text, tie_1, tie_2
LIMIT $8;

-- name: console_groups_page
-- The same, over the matching messages grouped by queue and error fingerprint.
WITH grouped AS (
    SELECT queue, coalesce(error_fingerprint, '') AS fingerprint,
           min(coalesce(error_type, reason)) AS error_type,
           min(coalesce(error_message, reason, '')) AS example_message,
           count(*) AS messages,
           min(coalesce(finished_at, updated_at)) AS first_seen,
           max(coalesce(finished_at, updated_at)) AS last_seen
    FROM rabbitretry.ledger
    WHERE rabbitretry.operator_filter(ledger, $1::text[], $2::text, $3::text, $4::text,
                                     $5::timestamptz, $6::timestamptz, $7::text)
    GROUP BY queue, coalesce(error_fingerprint, '')
), listed AS (
    SELECT *, count(*) OVER () AS total,
           CASE $9 WHEN 'last_seen' THEN last_seen WHEN 'first_seen' THEN first_seen
           END AS sort_time,
           CASE $9 WHEN 'messages' THEN messages END AS sort_number,
           CASE $9 WHEN 'queue' THEN queue END AS sort_text,
           queue AS tie_1, fingerprint AS tie_2
    FROM grouped
)
SELECT * FROM listed
WHERE rabbitretry.console_after(sort_time, sort_number, sort_text, tie_1, tie_2, $10::boolean,
                                $11::timestamptz, $12::bigint, $13::text, $14::text, $15::text)
ORDER BY CASE WHEN $10 THEN sort_time END DESC, CASE WHEN $10 THEN sort_number END DESC,
         CASE WHEN $10 THEN sort_text END DESC, CASE WHEN $10 THEN tie_1 END DESC,
         CASE WHEN $10 THEN tie_2 END DESC,
         sort_time, sort_number, sort_text, tie_1, tie_2
LIMIT $8;
