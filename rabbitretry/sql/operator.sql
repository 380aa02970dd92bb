-- The ledger writes an operator's actions make (see rabbitretry/ledger/operator.py): ignore,
-- undo an ignore, replace a payload before a replay, mark a replay. An action on many
-- messages writes each message's audit row in the same statement, so the audit can never
-- disagree with the ledger. A dead letter named by its key is tested with `status IS NOT
-- DISTINCT FROM 'dead'`, so that it is found by its key, never by a scan of ledger_dead_idx
-- (see lock_dead in operations.sql).

-- name: operations_ignore
-- A dead or retrying message no one will retry: its copies are dropped when they arrive.
UPDATE rabbitretry.ledger l
SET status = 'ignored', next_retry_at = NULL, lease_until = NULL,
    finished_at = now(), updated_at = now()
FROM (SELECT status FROM rabbitretry.ledger
      WHERE queue = $1 AND message_id = $2 FOR UPDATE) AS before
WHERE l.queue = $1 AND l.message_id = $2 AND l.status IN ('dead', 'retrying')
RETURNING before.status AS status_before;

-- name: operations_set_payload
-- The payload of a locked dead letter, replaced by an operator before its replay.
UPDATE rabbitretry.ledger SET payload = $3, updated_at = now()
WHERE queue = $1 AND message_id = $2 AND status IS NOT DISTINCT FROM 'dead';

-- name: operations_ignore_many
-- Dead letters ($1 queues, $2 keys, pairwise) no one will retry, in one statement: each gets
-- an audit row of batch $5 that keeps when it died, so the batch can be undone.
WITH chosen AS (
    SELECT l.queue, l.message_id, l.finished_at
    FROM rabbitretry.ledger l
    JOIN unnest($1::text[], $2::text[]) AS k (queue, message_id)
      ON l.queue = k.queue AND l.message_id = k.message_id
    WHERE l.status IS NOT DISTINCT FROM 'dead'
    FOR UPDATE OF l
), ignored AS (
    UPDATE rabbitretry.ledger l
    SET status = 'ignored', next_retry_at = NULL, lease_until = NULL,
        finished_at = now(), updated_at = now()
    FROM chosen c
    WHERE l.queue = c.queue AND l.message_id = c.message_id
    RETURNING l.queue, l.message_id, c.finished_at AS died_at
)
INSERT INTO rabbitretry.audit (actor, action, queue, message_id, detail, messages, comment, batch)
SELECT $3, 'ignore', queue, message_id,
       jsonb_build_object('status_before', 'dead', 'died_at', died_at), 1, $4, $5
FROM ignored;

-- name: operations_unignore_batch
-- Undo of batch $1: its messages still ignored are dead again (with their time of death),
-- each with an audit row of batch $4 (actor $2, comment $3).
WITH undone AS (
    UPDATE rabbitretry.ledger l
    SET status = 'dead', finished_at = coalesce((a.detail ->> 'died_at')::timestamptz, now()),
        updated_at = now()
    FROM rabbitretry.audit a
    WHERE a.batch = $1 AND a.action = 'ignore'
      AND l.queue = a.queue AND l.message_id = a.message_id AND l.status = 'ignored'
    RETURNING l.queue, l.message_id
)
INSERT INTO rabbitretry.audit (actor, action, queue, message_id, detail, messages, comment, batch)
SELECT $2, 'unignore', queue, message_id, jsonb_build_object('undoes', $1::text), 1, $3, $4
FROM undone;

-- name: mark_replayed
-- Gives a dead letter a fresh attempt budget; its copy is published in the same transaction.
-- The snapshot's headers become the replayed copy's ($3, the replay's trace context), so
-- that a re-drive continues the replay's trace, as the worker's copies of that copy do.
UPDATE rabbitretry.ledger
SET status = 'retrying', next_retry_at = now(), retry_copy_confirmed = true,
    attempts_forgiven = attempts, replays = replays + 1, finished_at = NULL, reason = NULL,
    headers = $3::jsonb, updated_at = now()
WHERE queue = $1 AND message_id = $2 AND status IS NOT DISTINCT FROM 'dead';
