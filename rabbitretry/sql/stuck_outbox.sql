-- Outbox rows no relay published, re-sent by the reconciler (see
-- rabbitretry/reconcile/stuck_outbox.py).

-- name: reconcile_stuck_outbox
-- Outbox rows still pending $1 seconds after they were due (no relay is running, or it
-- stalled), in per-key order like outbox_take (each key's oldest row: outbox_take_followers
-- then takes the rows behind it); at most $2, locked until the caller commits. Served by
-- outbox_pending_idx (status = 'pending', next_try_at, id).
SELECT id, exchange, routing_key, message_id, payload, headers, content_type, tries,
       ordering_key
FROM rabbitretry.outbox o
WHERE o.status = 'pending' AND o.next_try_at < now() - make_interval(secs => $1)
  AND (o.ordering_key IS NULL OR (
        SELECT max(older.id) FROM rabbitretry.outbox older
        WHERE older.ordering_key = o.ordering_key AND older.status = 'pending'
          AND older.id < o.id) IS NULL)
ORDER BY o.next_try_at, o.id
LIMIT $2
FOR UPDATE SKIP LOCKED;
