-- Heartbeats of periodic components (see rabbitretry/monitoring/heartbeat.py).

-- name: heartbeat_started
INSERT INTO rabbitretry.heartbeat (name, instance, started_at, expected_every)
VALUES ($1, $2, now(), $3)
ON CONFLICT (name) DO UPDATE
SET instance = excluded.instance, started_at = excluded.started_at,
    expected_every = excluded.expected_every;

-- name: heartbeat_finished
UPDATE rabbitretry.heartbeat
SET finished_at = now(), ok = ($3::text IS NULL), counts = $2::jsonb, error = $3
WHERE name = $1;

-- name: heartbeat_all
SELECT * FROM rabbitretry.heartbeat ORDER BY name;
