-- Scheduled jobs (see rabbitretry/scheduled_jobs.py): overlap lock and checkpoint.

-- name: job_try_lock
-- A session-level advisory lock per job name: held while the job runs, released on unlock or
-- when the session ends (a job that dies releases it with its connection).
SELECT pg_try_advisory_lock(hashtextextended('rabbitretry.job:' || $1, 0));

-- name: job_unlock
SELECT pg_advisory_unlock(hashtextextended('rabbitretry.job:' || $1, 0));

-- name: job_checkpoint_load
SELECT checkpoint FROM rabbitretry.job_checkpoint WHERE name = $1;

-- name: job_checkpoint_save
INSERT INTO rabbitretry.job_checkpoint (name, checkpoint) VALUES ($1, $2::jsonb)
ON CONFLICT (name) DO UPDATE SET checkpoint = excluded.checkpoint, updated_at = now();

-- name: job_checkpoint_clear
DELETE FROM rabbitretry.job_checkpoint WHERE name = $1;
