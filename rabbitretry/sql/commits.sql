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
-- key, so two batches lock rows in the same order; `claim_many` plans its body once per
-- session, migration 0021). Commits without waiting for its flush only when every claim in
-- it succeeded.
WITH claims AS MATERIALIZED (
    SELECT * FROM rabbitretry.claim_many($1::text[], $2::text[], $3::int[], $4::float8[],
                                         $5::text[], $6::int[], $7::bytea[], $8::jsonb[],
                                         $9::jsonb[], $10::text[], $11::text[])
)
SELECT ord, verdict, attempt, budget_attempt, wait_seconds, status,
       (SELECT set_config('synchronous_commit',
                          CASE WHEN bool_and(verdict = 'claimed') THEN 'off' ELSE 'on' END,
                          true)
        FROM claims) AS commit_mode
FROM claims ORDER BY ord;

-- name: batching_succeeded_many
-- The success marks of many attempts (`succeed_many`: as `finish_attempt` with status
-- succeeded; $4: keep each one's snapshot), in one synchronous commit; no attempt-log row (the
-- ledger row is the success). Returns the attempts that were still current; one missing had
-- lost its lease to another attempt.
SELECT queue, message_id, attempt
FROM rabbitretry.succeed_many($1::text[], $2::text[], $3::int[], $4::bool[]);

-- name: batching_started_many
-- The start marks of many attempts (`mark_started_many`: as `mark_started`), in one commit
-- that does not wait for its flush. Returns the attempts still open; one missing is no longer
-- ours.
SELECT queue, message_id, attempt,
       (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
FROM rabbitretry.mark_started_many($1::text[], $2::text[], $3::int[]);
