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

-- What an operator's filter matches, one definition for the CLI's lists, groups and exports and
-- the console's pages: $2 statuses, $3 queue, $4 error type or reason, $5 fingerprint, $6 and
-- $7 the time range of the last change, $8 text (in the key, the error type or the error
-- message); a NULL does not narrow. A single expression, so the planner inlines it and still
-- uses the ledger's indexes.
CREATE FUNCTION rabbitretry.operator_filter(
    l rabbitretry.ledger, statuses text[], queue text, error text, fingerprint text,
    since timestamptz, until timestamptz, search text
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT l.status = ANY(statuses)
       AND (queue IS NULL OR l.queue = queue)
       AND (error IS NULL OR l.error_type = error OR l.reason = error)
       AND (fingerprint IS NULL OR l.error_fingerprint = fingerprint)
       AND (since IS NULL OR coalesce(l.finished_at, l.updated_at) >= since)
       AND (until IS NULL OR coalesce(l.finished_at, l.updated_at) <= until)
       AND (search IS NULL OR strpos(lower(l.message_id), lower(search)) > 0
            OR strpos(lower(coalesce(l.error_type, '')), lower(search)) > 0
            OR strpos(lower(coalesce(l.error_message, '')), lower(search)) > 0)
$$;

-- Whether a row of a console list comes after the cursor (the last row of the page before) in
-- the list's order: its sort value (one of time, number, text is set) and its two-column tie,
-- compared with the cursor's; no cursor (a NULL tie), every row does.
CREATE FUNCTION rabbitretry.console_after(
    sort_time timestamptz, sort_number bigint, sort_text text, tie_1 text, tie_2 text,
    descending boolean,
    cursor_time timestamptz, cursor_number bigint, cursor_text text, cursor_1 text,
    cursor_2 text
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT cursor_1 IS NULL OR CASE WHEN descending
        THEN (coalesce(sort_time, '-infinity'), coalesce(sort_number, 0),
              coalesce(sort_text, ''), tie_1, tie_2)
           < (coalesce(cursor_time, '-infinity'), coalesce(cursor_number, 0),
              coalesce(cursor_text, ''), cursor_1, cursor_2)
        ELSE (coalesce(sort_time, '-infinity'), coalesce(sort_number, 0),
              coalesce(sort_text, ''), tie_1, tie_2)
           > (coalesce(cursor_time, '-infinity'), coalesce(cursor_number, 0),
              coalesce(cursor_text, ''), cursor_1, cursor_2) END
$$;
