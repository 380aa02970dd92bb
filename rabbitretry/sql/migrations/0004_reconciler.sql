-- The reconciler and scheduled jobs.

-- When the reconciler last re-published a ledger row's snapshot. A row it re-drove is left
-- alone for a grace period, so that two reconcilers never publish the same message twice and
-- one reconciler does not flood a queue whose workers are down.
ALTER TABLE rabbitretry.ledger
    ADD COLUMN redriven_at timestamptz,
    ADD COLUMN redrives    integer NOT NULL DEFAULT 0;

-- Orphan check of an expected-vs-actual reconciliation: what succeeded in a time window.
CREATE INDEX ledger_succeeded_idx ON rabbitretry.ledger (queue, finished_at)
    WHERE status = 'succeeded';

-- Keys an expected-vs-actual reconciliation re-published because no delivery of them was ever
-- seen; the row makes the re-publication happen once per grace period, whatever the number
-- of reconcilers.
CREATE TABLE rabbitretry.reconciler_republished (
    queue           text        NOT NULL,
    message_id      text        NOT NULL,
    reconciliation  text        NOT NULL,
    republished_at  timestamptz NOT NULL DEFAULT now(),
    times           integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (queue, message_id)
);

-- Where a scheduled job got to: a job that crashed resumes from its last saved checkpoint.
CREATE TABLE rabbitretry.job_checkpoint (
    name        text        PRIMARY KEY,
    checkpoint  jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
