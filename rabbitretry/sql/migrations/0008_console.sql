-- The console's state, kept in the ledger's database so that a restarted console, or a second
-- one beside it, sees the same: replays running in the background, and sessions logged out.
CREATE TABLE rabbitretry.console_job (
    id          text        PRIMARY KEY,
    title       text        NOT NULL,
    actor       text        NOT NULL,
    report      jsonb       NOT NULL,  -- operations.ReplayReport, without the replayed keys
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),  -- written every few seconds while it runs
    done        boolean     NOT NULL DEFAULT false,
    error       text
);
CREATE INDEX console_job_started_idx ON rabbitretry.console_job (started_at DESC);

-- A session cookie stays valid until it expires unless its nonce is here (a logout).
CREATE TABLE rabbitretry.console_revoked (
    nonce       text        PRIMARY KEY,
    expires_at  timestamptz NOT NULL
);

-- The per-message audit rows of an action on many messages name it (its batch), so the audit
-- can show one row per operation (the batch's summary row, action `...-batch`) and still list
-- each message on demand.
ALTER TABLE rabbitretry.audit ADD COLUMN batch text;
CREATE INDEX audit_operations_idx ON rabbitretry.audit (at DESC, id DESC)
    WHERE batch IS NULL OR action LIKE '%-batch';
-- Undoing a batch finds its rows by batch.
CREATE INDEX audit_batch_idx ON rabbitretry.audit (batch) WHERE batch IS NOT NULL;
