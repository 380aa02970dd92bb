-- The latest run of each periodic component (the reconciler, scheduled jobs), one row per name.
-- A component that stops running, or keeps failing, shows here: `rabbitretry status` and the
-- alerts compare finished_at with expected_every.
CREATE TABLE rabbitretry.heartbeat (
    name            text        PRIMARY KEY,
    instance        text        NOT NULL,           -- host:pid of the run
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz,                    -- NULL while a run is in progress
    ok              boolean,                        -- NULL while running; false: error is set
    counts          jsonb       NOT NULL DEFAULT '{}',
    error           text,
    expected_every  double precision NOT NULL CHECK (expected_every > 0)  -- seconds between runs
);
