-- Recover hooks (rabbitretry/ledger/recover_hooks.py): which queues' dead messages get a run of
-- their consumer's on_dead; the trigger rabbitretry.recover_on_dead writes the runs.

-- name: recover_hook_register
INSERT INTO rabbitretry.recover_hook (queue, recover_queue) VALUES ($1, $2)
ON CONFLICT (queue) DO UPDATE SET recover_queue = excluded.recover_queue
WHERE rabbitretry.recover_hook.recover_queue <> excluded.recover_queue;

-- name: recover_hook_unregister
DELETE FROM rabbitretry.recover_hook WHERE queue = $1;

-- name: recover_hook_run
-- The run of the recover hook for message $2 of queue $1 (its latest death), if any.
SELECT l.status, l.attempts, l.attempts - l.attempts_forgiven AS charged, l.reason,
       l.error_type, l.error_message, l.finished_at, l.message_id
FROM rabbitretry.recover_hook h
JOIN rabbitretry.ledger l ON l.queue = h.recover_queue
WHERE h.queue = $1 AND l.message_id LIKE 'recover:%' AND l.headers->>'x-rabbitretry-recover-of' = $2
ORDER BY l.first_seen DESC
LIMIT 1;

-- name: recover_hook_of
SELECT recover_queue FROM rabbitretry.recover_hook WHERE queue = $1;
