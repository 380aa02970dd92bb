-- Downstream breakers (rabbitretry.downstream): what workers read and write around their
-- handlers' calls, and what an operator does. The transitions that count failures and close
-- a breaker are the functions rabbitretry.downstream_failed and downstream_succeeded.

-- name: downstream_failed
SELECT * FROM rabbitretry.downstream_failed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: downstream_succeeded
SELECT rabbitretry.downstream_succeeded($1, $2);

-- name: downstream_states
-- A worker's view of the downstreams its consumers call ($1), refreshed every second.
SELECT name, state, failures, probe_worker,
       state = 'open' AND forced IS NULL AND next_probe_at <= now() AS probe_due
FROM rabbitretry.downstream WHERE name = ANY($1::text[]);

-- name: downstream_take_probe
-- Worker $2 tries one delivery: the breaker is open and its probe is due (or the last probe's
-- worker let its hold of $3 seconds run out). One worker at a time wins it.
UPDATE rabbitretry.downstream
SET state = 'half-open', probe_worker = $2,
    probe_until = clock_timestamp() + make_interval(secs => $3), updated_at = now()
WHERE name = $1 AND forced IS NULL
  AND ((state = 'open' AND next_probe_at <= clock_timestamp())
       OR (state = 'half-open' AND probe_until < clock_timestamp()))
RETURNING 1;

-- name: downstream_return_probe
-- Worker $2's probe came to nothing (no delivery waited, or the delivery never called the
-- downstream): open again, the next probe due in $3 seconds, the pause unchanged.
UPDATE rabbitretry.downstream
SET state = 'open', probe_worker = NULL, probe_until = NULL,
    next_probe_at = clock_timestamp() + make_interval(secs => $3), updated_at = now()
WHERE name = $1 AND state = 'half-open' AND probe_worker = $2
RETURNING 1;

-- name: downstream_list
SELECT name, state, since, failures, last_error, pause_seconds, next_probe_at, probe_worker,
       probes, opened, forced, forced_by, updated_at
FROM rabbitretry.downstream ORDER BY name;

-- name: downstream_force_open
-- An operator holds downstream $1 open (no probes) until they close it; $2 says who.
INSERT INTO rabbitretry.downstream AS d (name, state, forced, forced_by)
VALUES ($1, 'open', 'open', $2)
ON CONFLICT (name) DO UPDATE
SET state = 'open', forced = 'open', forced_by = $2,
    since = CASE WHEN d.state = 'closed' THEN now() ELSE d.since END,
    next_probe_at = NULL, probe_worker = NULL, probe_until = NULL, updated_at = now()
RETURNING (xmax = 0) AS created;

-- name: downstream_force_close
-- An operator closes downstream $1 ($2 says who): calls go through again, failures count
-- from zero, and the breaker trips again by itself if they cross the threshold.
UPDATE rabbitretry.downstream d
SET state = 'closed', forced = NULL, forced_by = $2, failures = 0, first_failure_at = NULL,
    since = CASE WHEN d.state = 'closed' THEN d.since ELSE now() END,
    pause_seconds = 0, next_probe_at = NULL, probe_worker = NULL, probe_until = NULL,
    updated_at = now()
WHERE name = $1
RETURNING 1;

-- name: downstream_declare
-- A worker starts: the downstreams $1 are called by the handlers of work queue $2 (what the
-- operator's listing and the alerts say is waiting on an open breaker).
INSERT INTO rabbitretry.downstream AS d (name, queues)
SELECT name, ARRAY[$2::text] FROM unnest($1::text[]) AS name
ON CONFLICT (name) DO UPDATE
SET queues = d.queues || $2::text
WHERE NOT $2::text = ANY (d.queues);

-- name: downstream_breakers
-- Every breaker, for the operator's listing: its state and the work queues that call it.
SELECT name, state, since, failures, last_error, pause_seconds, next_probe_at, probe_worker,
       probes, opened, forced, forced_by, queues, updated_at
FROM rabbitretry.downstream ORDER BY name;

-- name: downstream_lock
-- Breaker $1, locked while an operator opens or closes it and writes the audit row (NULL:
-- no breaker of that name has been recorded).
SELECT name, state, since, failures, last_error, pause_seconds, next_probe_at, probe_worker,
       probes, opened, forced, forced_by, queues, updated_at
FROM rabbitretry.downstream WHERE name = $1
FOR UPDATE;

-- name: downstream_names
-- The names of the breakers recorded so far (what an unknown name is told).
SELECT name FROM rabbitretry.downstream ORDER BY name;

-- name: downstream_members
-- Worker $2 calls the rate-limited downstreams $1: it notes itself, and learns how many
-- workers were seen within $3 seconds (itself included) and its rank among them by name.
-- Workers gone for an hour are forgotten.
WITH seen AS (
    INSERT INTO rabbitretry.downstream_member AS m (name, worker)
    SELECT name, $2 FROM unnest($1::text[]) AS name
    ON CONFLICT (name, worker) DO UPDATE SET seen_at = now()
), gone AS (
    DELETE FROM rabbitretry.downstream_member WHERE seen_at < now() - interval '1 hour'
)
SELECT n.name, 1 + count(m.worker)::int AS members,
       (count(m.worker) FILTER (WHERE m.worker < $2))::int AS rank
FROM unnest($1::text[]) AS n(name)
LEFT JOIN rabbitretry.downstream_member m
  ON m.name = n.name AND m.worker <> $2 AND m.seen_at > now() - make_interval(secs => $3)
GROUP BY n.name;
