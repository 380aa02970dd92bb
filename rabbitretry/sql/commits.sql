-- Ledger writes of concurrent attempts, committed together (see rabbitretry/ledger/commits.py).

-- name: batching_claim
-- One claim (the `claim` statement). A claim that succeeds commits without waiting for its
-- WAL flush: the attempt always ends with a synchronous commit (success mark, retry or dead
-- letter) before its delivery is acked, and that commit flushes the claim with it. Every
-- other verdict commits synchronously, as it may lead straight to an ack. docs/concepts.md
-- ("Durability of a claim") gives the argument.
SELECT c.verdict, c.attempt, c.budget_attempt, c.wait_seconds, c.status,
       set_config('synchronous_commit',
                  CASE WHEN c.verdict = 'claimed' THEN 'off' ELSE 'on' END, true) AS commit_mode
FROM rabbitretry.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS c;

-- name: batching_claim_many
-- Many claims in one statement and one transaction, in the order given (callers sort them by
-- key, so two batches lock rows in the same order). Commits without waiting for its flush
-- only when every claim in it succeeded.
WITH claims AS MATERIALIZED (
    SELECT i.ord, c.*
    FROM unnest($1::text[], $2::text[], $3::int[], $4::float8[], $5::text[], $6::int[],
                $7::bytea[], $8::jsonb[], $9::jsonb[], $10::text[], $11::text[])
         WITH ORDINALITY AS i(queue, message_id, max_attempts, lease_seconds, worker,
                              copy_attempts, payload, headers, properties, exchange,
                              routing_key, ord)
    CROSS JOIN LATERAL rabbitretry.claim(i.queue, i.message_id, i.max_attempts,
                                         i.lease_seconds, i.worker, i.copy_attempts,
                                         i.payload, i.headers, i.properties, i.exchange,
                                         i.routing_key) AS c
)
SELECT ord, verdict, attempt, budget_attempt, wait_seconds, status,
       (SELECT set_config('synchronous_commit',
                          CASE WHEN bool_and(verdict = 'claimed') THEN 'off' ELSE 'on' END,
                          true)
        FROM claims) AS commit_mode
FROM claims ORDER BY ord;

-- name: batching_succeeded_many
-- The success marks of many attempts (as `finish_attempt` with status succeeded; $4: keep
-- each one's snapshot; without it only the publish time of the properties stays), in one
-- synchronous commit; no attempt-log row (the ledger row is the success). Returns the attempts
-- that were still current; one missing had lost its lease to another attempt.
UPDATE rabbitretry.ledger l
SET status = 'succeeded', reason = NULL, error_type = NULL, error_message = NULL,
    error_traceback = NULL, error_fingerprint = NULL, finished_at = now(),
    updated_at = now(), lease_until = NULL, next_retry_at = NULL,
    payload = CASE WHEN i.keep THEN l.payload END,
    headers = CASE WHEN i.keep THEN l.headers END,
    properties = CASE
        WHEN i.keep THEN l.properties
        WHEN l.properties ? 'timestamp'
        THEN jsonb_build_object('timestamp', l.properties -> 'timestamp')
    END
FROM unnest($1::text[], $2::text[], $3::int[], $4::bool[])
     AS i(queue, message_id, attempt, keep)
WHERE l.queue = i.queue AND l.message_id = i.message_id AND l.attempts = i.attempt
  AND l.status = 'processing'
RETURNING l.queue, l.message_id, l.attempts AS attempt;

-- name: batching_started_many
-- The start marks of many attempts (as `mark_started`), in one commit that does not wait for
-- its flush. Returns the attempts still open; one missing is no longer ours.
WITH started AS (
    UPDATE rabbitretry.ledger l
    SET handler_started_at = clock_timestamp()
    FROM unnest($1::text[], $2::text[], $3::int[]) AS i(queue, message_id, attempt)
    WHERE l.queue = i.queue AND l.message_id = i.message_id AND l.attempts = i.attempt
      AND l.status = 'processing'
    RETURNING l.queue, l.message_id, l.attempts AS attempt
)
SELECT queue, message_id, attempt,
       (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
FROM started;
