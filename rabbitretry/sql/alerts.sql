-- Alerts (see rabbitretry/monitoring/alerts.py and migrations/0006_alerts.sql).

-- name: alerts_take
-- Alerts due for a delivery try: open dead-letter alerts whose window ($1 seconds) has closed,
-- and pending alerts coming due, at most $2 of each. Taking one moves its next_try_at a lease
-- ($3 seconds) ahead, so a deliverer that dies mid-send leaves it to another after the lease.
-- A downstream's alerts (opened, closed) go out in the order they were raised: one is not
-- taken while an older one of the same downstream is still to be sent and not taken with it
-- (backing off, or leased to another deliverer).
WITH closed AS (
    SELECT id FROM rabbitretry.alert
    WHERE status = 'open' AND first_seen <= now() - make_interval(secs => $1)
    ORDER BY first_seen LIMIT $2
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT id FROM rabbitretry.alert
    WHERE status = 'pending' AND next_try_at <= now()
    ORDER BY next_try_at, id LIMIT $2
    FOR UPDATE SKIP LOCKED
), taken AS (
    SELECT id FROM closed UNION ALL SELECT id FROM due
)
UPDATE rabbitretry.alert a
SET status = 'pending', tries = a.tries + 1, next_try_at = now() + make_interval(secs => $3)
WHERE a.id IN (SELECT id FROM taken)
  AND NOT (a.kind = 'downstream' AND EXISTS (
      SELECT 1 FROM rabbitretry.alert older
      WHERE older.kind = 'downstream' AND older.group_key = a.group_key AND older.id < a.id
        AND older.status = 'pending' AND older.id NOT IN (SELECT id FROM taken)))
RETURNING a.*;

-- name: alerts_sent
UPDATE rabbitretry.alert SET status = 'sent', sent_at = now(), last_error = NULL
WHERE id = $1 AND status = 'pending';

-- name: alerts_failed_try
-- The webhook refused alert $1: try again in $2 seconds.
UPDATE rabbitretry.alert
SET next_try_at = now() + make_interval(secs => $2), last_error = $3
WHERE id = $1 AND status = 'pending';

-- name: alerts_hold
-- Alert $1 was taken, but an older alert of its downstream was just refused: not sent, and
-- not a try of its own; it waits $2 seconds (and behind the older one, by alerts_take).
UPDATE rabbitretry.alert
SET tries = greatest(tries - 1, 0), next_try_at = now() + make_interval(secs => $2)
WHERE id = $1 AND status = 'pending';

-- name: alerts_note_detail
-- What the deliverer learnt for alert $1 (the messages waiting on a downstream's queues),
-- kept with it, so that a retry sends the same text and the listing shows what was sent.
UPDATE rabbitretry.alert SET detail = detail || $2::jsonb
WHERE id = $1 AND status = 'pending';

-- name: alerts_lock_group
-- Serialises raising condition alerts of one group (until the transaction ends).
SELECT pg_advisory_xact_lock(hashtext('rabbitretry.alert:' || $1 || ':' || $2));

-- name: alerts_raise
-- A condition alert (kind $1, group $2), unless the same group alerted in the last $7 seconds.
INSERT INTO rabbitretry.alert (kind, group_key, queue, error_type, error_message, detail)
SELECT $1, $2, $3, $4, $5, $6::jsonb
WHERE NOT EXISTS (
    SELECT 1 FROM rabbitretry.alert
    WHERE kind = $1 AND group_key = $2 AND first_seen > now() - make_interval(secs => $7)
)
RETURNING id;

-- name: alerts_recent
-- The newest alerts, optionally only those of status $1.
SELECT * FROM rabbitretry.alert
WHERE $1::text IS NULL OR status = $1
ORDER BY id DESC
LIMIT $2;

