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

-- name: console_audit_operations
-- The latest audit rows, one per operation: a replay of many messages is its replay-batch
-- row, not one row per message ($2 true: every row).
SELECT id, at, actor, action, queue, message_id, detail, messages, comment, batch
FROM rabbitretry.audit
WHERE $2 OR batch IS NULL OR action = 'replay-batch'
ORDER BY at DESC, id DESC
LIMIT $1;
