-- A succeeded message keeps no snapshot, unless its consumer says keep_payload = "always".
--
-- The snapshot (payload, headers, properties) is what a replay, a re-drive or a retry copy
-- sends again: rows in flight, dead and ignored need it. A succeeded row is kept to
-- deduplicate and to be audited, for which its key, status, attempts and times suffice; its
-- snapshot was most of its size. The success mark now writes NULL there (a NULL costs a bit),
-- in the statement it runs anyway: no later pass rewrites the row. The check keeps every
-- other status's snapshot: nothing can replay a message whose body is gone. It is added
-- NOT VALID, which needs no scan (the lock is brief); 0015 validates it without blocking.

ALTER TABLE rabbitretry.ledger
    ALTER COLUMN payload DROP NOT NULL,
    ALTER COLUMN headers DROP NOT NULL,
    ALTER COLUMN properties DROP NOT NULL,
    ADD CONSTRAINT ledger_snapshot_kept CHECK (
        status = 'succeeded' OR (payload IS NOT NULL AND headers IS NOT NULL
                                 AND properties IS NOT NULL)
    ) NOT VALID;
