-- The outbox (see rabbitretry/outbox/ and migrations/0002_outbox.sql): enqueue in the
-- caller's transaction, take a batch to relay, mark it sent or failed; `rabbitretry outbox`.

-- name: outbox_enqueue
INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, ordering_key, payload,
                                headers, content_type)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id;

-- name: outbox_notify
SELECT pg_notify('rabbitretry_outbox', '');

-- name: outbox_take
-- Pending rows that are due, locked for this relay; a row waits while an older row with the
-- same ordering key is still pending, so messages of one key leave in order. $2: only rows
-- due at or after it (NULL: all of them), where the relay's scan starts (ScanFloor in
-- rabbitretry/outbox/scan.py). The older row is looked for as the key's nearest one below (max,
-- an index scan backward), not as NOT EXISTS: every row of the key sent since the last
-- vacuum left its entry in outbox_ordering_idx, and NOT EXISTS walked them all from the
-- oldest, for each of the key's pending rows (a key with 200,000 sent rows and 100 pending:
-- 77,000 pages and 67 ms a poll; with max, 1,200 and 5 ms).
SELECT id, exchange, routing_key, message_id, payload, headers, content_type, tries,
       next_try_at, ordering_key
FROM rabbitretry.outbox o
WHERE o.status = 'pending' AND o.next_try_at <= now()
  AND o.next_try_at >= coalesce($2::timestamptz, '-infinity')
  AND (o.ordering_key IS NULL OR (
        SELECT max(older.id) FROM rabbitretry.outbox older
        WHERE older.ordering_key = o.ordering_key AND older.status = 'pending'
          AND older.id < o.id) IS NULL)
ORDER BY o.next_try_at, o.id
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: outbox_window_heads
-- The ids of the heads (as outbox_take) among the first $3 due rows only, in due order from
-- $2 on, at most $1; outbox_take_ids then locks them. Behind a key with a backlog,
-- outbox_take checks every pending row of that key at every poll (20,000 pending rows of
-- one key: 20,000 index lookups a poll), as only one of them is its head; the runs taken
-- behind the heads found here fill the batch. When it finds nothing (every row in the window
-- held back, say behind a head that backs off), the relay runs outbox_take. The window is a
-- subquery with a LIMIT, which the planner keeps as it is: the check of a row's head runs on
-- the window's rows alone, whatever the statistics say.
SELECT id
FROM (
    SELECT w.id, w.ordering_key, w.next_try_at FROM rabbitretry.outbox w
    WHERE w.status = 'pending' AND w.next_try_at <= now()
      AND w.next_try_at >= coalesce($2::timestamptz, '-infinity')
    ORDER BY w.next_try_at, w.id
    LIMIT $3
) o
WHERE o.ordering_key IS NULL OR (
        SELECT max(older.id) FROM rabbitretry.outbox older
        WHERE older.ordering_key = o.ordering_key AND older.status = 'pending'
          AND older.id < o.id) IS NULL
ORDER BY o.next_try_at, o.id
LIMIT $1;

-- name: outbox_take_ids
-- The rows of outbox_window_heads, locked for this relay (one another relay holds is
-- skipped), with their status: the relay takes those still pending. Each is looked up by
-- its key on its own (a subquery that locks is planned as it is written), whatever the
-- planner's statistics say: on an outbox not analyzed since a backlog came, a test of the
-- status, or of all the keys at once, was planned as a walk of every pending row.
SELECT o.id, o.exchange, o.routing_key, o.message_id, o.payload, o.headers, o.content_type,
       o.tries, o.next_try_at, o.ordering_key, o.status
FROM unnest($1::bigint[]) AS head(id)
CROSS JOIN LATERAL (
    SELECT * FROM rabbitretry.outbox o WHERE o.id = head.id FOR UPDATE SKIP LOCKED
) o
ORDER BY o.next_try_at, o.id;

-- name: outbox_take_followers
-- The pending rows that follow each head row taken ($1: their ordering keys, $2: their ids),
-- in id order, at most $3 a key, locked for this relay, up to the first one not due (a row
-- that backed off holds the rest of its key back): the relay publishes a key's run one row
-- after the other, so a key with a backlog leaves a run a poll rather than a row. Served by
-- outbox_ordering_idx from the head on, so the key's sent rows are not walked. FOR UPDATE
-- waits rather than skips: a row skipped would be overtaken by the rows after it (no other
-- relay takes rows behind a head it does not hold).
SELECT id, exchange, routing_key, message_id, payload, headers, content_type, tries,
       next_try_at, ordering_key
FROM (
    SELECT f.*, bool_and(f.next_try_at <= now())
                    OVER (PARTITION BY f.ordering_key ORDER BY f.id) AS due_so_far
    FROM unnest($1::text[], $2::bigint[]) AS head(ordering_key, id)
    CROSS JOIN LATERAL (
        SELECT * FROM rabbitretry.outbox f
        WHERE f.ordering_key = head.ordering_key AND f.status = 'pending' AND f.id > head.id
        ORDER BY f.id
        LIMIT $3
        FOR UPDATE
    ) f
) followers
WHERE due_so_far
ORDER BY ordering_key, id;

-- name: outbox_sent
UPDATE rabbitretry.outbox SET status = 'sent', sent_at = now(), tries = tries + 1,
                              last_error = NULL
WHERE id = ANY($1::bigint[]);

-- name: outbox_failed_try
-- A try failed: back off, or give up after $3 tries (status failed, kept for people to see).
UPDATE rabbitretry.outbox
SET tries = tries + 1, last_error = $2,
    status = CASE WHEN tries + 1 >= $3 THEN 'failed' ELSE 'pending' END,
    next_try_at = now() + make_interval(secs => $4)
WHERE id = $1;

-- name: outbox_unpublishable
-- The row's message cannot be encoded as AMQP ($2 says why): failed at once, as no try can
-- succeed. A failed row no longer holds back later rows of its ordering key.
UPDATE rabbitretry.outbox SET status = 'failed', tries = tries + 1, last_error = $2
WHERE id = $1;

-- name: outbox_stats
SELECT status, count(*) AS messages, min(created_at) AS oldest, max(tries) AS most_tries
FROM rabbitretry.outbox GROUP BY status ORDER BY status;

-- name: outbox_list_failed
SELECT id, created_at, exchange, routing_key, message_id, tries, last_error
FROM rabbitretry.outbox WHERE status = 'failed' ORDER BY created_at DESC LIMIT $1;

-- name: outbox_retry_failed
-- Give failed rows another full set of tries (optionally one row).
UPDATE rabbitretry.outbox SET status = 'pending', tries = 0, next_try_at = now()
WHERE status = 'failed' AND ($1::bigint IS NULL OR id = $1)
RETURNING id;
