-- Operator actions: a comment on each audit row, and rows for whole operations (a group replay,
-- an export) that name no single message but say how many they touched.
ALTER TABLE rabbitretry.audit
    ALTER COLUMN queue DROP NOT NULL,
    ALTER COLUMN message_id DROP NOT NULL,
    ADD COLUMN messages integer NOT NULL DEFAULT 1 CHECK (messages >= 0),
    ADD COLUMN comment  text;
CREATE INDEX audit_at_idx ON rabbitretry.audit (at DESC);

-- Listing and grouping by fingerprint scan only the rows an operator acts on.
CREATE INDEX ledger_fingerprint_idx ON rabbitretry.ledger (error_fingerprint, finished_at)
    WHERE status IN ('dead', 'retrying', 'ignored');
