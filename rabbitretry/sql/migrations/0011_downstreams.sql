-- Downstream breakers: one row per service a handler calls, shared by every worker of the
-- ledger database, so that ten workers see one state and an outage trips the breaker once.
--
-- closed     calls go through; `failures` counts the failures since the last success, within
--            `failure_window` seconds of the first of them
-- open       no calls: consumers that depend on it stop taking deliveries; a probe is due at
--            `next_probe_at`, after `pause_seconds` (doubled on each failed probe, capped)
-- half-open  one worker (`probe_worker`, until `probe_until`) is trying one delivery
--
-- An operator may hold it open (`forced` = 'open') until they close it.
CREATE TABLE rabbitretry.downstream (
    name            text        PRIMARY KEY,
    state           text        NOT NULL DEFAULT 'closed'
                                CHECK (state IN ('closed', 'open', 'half-open')),
    since           timestamptz NOT NULL DEFAULT now(),  -- closed since, or unavailable since
    failures        integer     NOT NULL DEFAULT 0 CHECK (failures >= 0),
    first_failure_at timestamptz,
    last_error      text,
    pause_seconds   double precision NOT NULL DEFAULT 0,
    next_probe_at   timestamptz,
    probe_worker    text,
    probe_until     timestamptz,
    probes          integer     NOT NULL DEFAULT 0,  -- probes that failed in this outage
    opened          integer     NOT NULL DEFAULT 0,  -- how many times it has opened
    forced          text        CHECK (forced IN ('open')),
    forced_by       text,
    queues          text[]      NOT NULL DEFAULT '{}',  -- the work queues whose handlers call it
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT downstream_probe_check CHECK (state <> 'half-open' OR probe_worker IS NOT NULL)
);

-- The workers that call a rate-limited downstream, each noting itself every second: each
-- takes its share of the downstream's limits (rabbitretry/delivery/limits.py).
CREATE TABLE rabbitretry.downstream_member (
    name            text        NOT NULL,
    worker          text        NOT NULL,
    seen_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, worker)
);

-- The attempt log says which downstream failed an attempt, and a deferred attempt (its
-- downstream's breaker was open) is kept in the history without being counted.
ALTER TABLE rabbitretry.attempt ADD COLUMN downstream text;
ALTER TABLE rabbitretry.attempt DROP CONSTRAINT attempt_outcome_check;
ALTER TABLE rabbitretry.attempt ADD CONSTRAINT attempt_outcome_check CHECK (outcome IN
    ('succeeded', 'retry', 'dead', 'crashed', 'interrupted', 'skipped', 'deferred'));
-- The attempts a trip forgives: charged failures of one downstream, by when they ended.
CREATE INDEX attempt_downstream_idx ON rabbitretry.attempt (downstream, finished_at)
    WHERE downstream IS NOT NULL AND outcome = 'retry';

-- A breaker that opens or closes raises an alert, stored in the transaction that moves it.
ALTER TABLE rabbitretry.alert DROP CONSTRAINT alert_kind_check;
ALTER TABLE rabbitretry.alert ADD CONSTRAINT alert_kind_check
    CHECK (kind IN ('dead', 'heartbeat', 'backlog', 'downstream'));

-- A call to downstream `p_name` failed, in attempt `p_attempt` of (`p_queue`,
-- `p_message_id`) (recorded first, if it was charged). Counted while closed; the failure that
-- makes `p_threshold` within `p_window` seconds opens it, and forgives the attempts this
-- downstream's failures charged in the last `p_window` seconds (outcome retry -> deferred,
-- attempts_forgiven + 1): an outage costs no attempt. A failure met while it is not closed forgives its own attempt. A failure of the
-- worker holding the probe reopens it with a doubled pause.
CREATE FUNCTION rabbitretry.downstream_failed(
    p_name text, p_worker text, p_threshold integer, p_window double precision,
    p_first_pause double precision, p_max_pause double precision, p_error text,
    p_queue text, p_message_id text, p_attempt integer
) RETURNS TABLE (state text, failures integer, opened boolean, forgiven integer)
LANGUAGE plpgsql AS $$
DECLARE
    d rabbitretry.downstream;
    n integer := 0;
BEGIN
    INSERT INTO rabbitretry.downstream (name) VALUES (p_name) ON CONFLICT DO NOTHING;
    SELECT * INTO d FROM rabbitretry.downstream x WHERE x.name = p_name FOR UPDATE;
    IF d.state <> 'closed' THEN
        WITH forgiven AS (
            UPDATE rabbitretry.attempt a SET outcome = 'deferred'
            WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt
              AND a.downstream = p_name AND a.outcome = 'retry'
            RETURNING a.queue, a.message_id
        )
        UPDATE rabbitretry.ledger l SET attempts_forgiven = l.attempts_forgiven + 1
        FROM forgiven f WHERE l.queue = f.queue AND l.message_id = f.message_id;
    END IF;
    IF d.state = 'half-open' AND d.probe_worker = p_worker THEN
        UPDATE rabbitretry.downstream x
        SET state = 'open', pause_seconds = least(greatest(x.pause_seconds, p_first_pause) * 2,
                                                  p_max_pause),
            next_probe_at = clock_timestamp() + make_interval(secs => least(
                greatest(x.pause_seconds, p_first_pause) * 2, p_max_pause)),
            probe_worker = NULL, probe_until = NULL, probes = x.probes + 1,
            last_error = p_error, updated_at = now()
        WHERE x.name = p_name;
        RETURN QUERY SELECT 'open'::text, d.failures, false, 0;
        RETURN;
    END IF;
    IF d.state <> 'closed' THEN
        RETURN QUERY SELECT d.state, d.failures, false, 0;
        RETURN;
    END IF;
    IF d.first_failure_at IS NULL
       OR d.first_failure_at < clock_timestamp() - make_interval(secs => p_window) THEN
        d.failures := 1;
        d.first_failure_at := clock_timestamp();
    ELSE
        d.failures := d.failures + 1;
    END IF;
    IF d.failures < p_threshold THEN
        UPDATE rabbitretry.downstream x
        SET failures = d.failures, first_failure_at = d.first_failure_at, last_error = p_error,
            updated_at = now()
        WHERE x.name = p_name;
        RETURN QUERY SELECT 'closed'::text, d.failures, false, 0;
        RETURN;
    END IF;
    UPDATE rabbitretry.downstream x
    SET state = 'open', since = clock_timestamp(), failures = d.failures,
        first_failure_at = d.first_failure_at, last_error = p_error,
        pause_seconds = p_first_pause,
        next_probe_at = clock_timestamp() + make_interval(secs => p_first_pause),
        probes = 0, opened = x.opened + 1, updated_at = now()
    WHERE x.name = p_name;
    WITH forgiven AS (
        UPDATE rabbitretry.attempt a SET outcome = 'deferred'
        WHERE a.downstream = p_name AND a.outcome = 'retry'
          AND a.finished_at >= clock_timestamp() - make_interval(secs => p_window)
        RETURNING a.queue, a.message_id
    ), per_key AS (
        SELECT f.queue, f.message_id, count(*)::int AS n FROM forgiven f
        GROUP BY f.queue, f.message_id
    ), counted AS (
        UPDATE rabbitretry.ledger l SET attempts_forgiven = l.attempts_forgiven + k.n
        FROM per_key k WHERE l.queue = k.queue AND l.message_id = k.message_id
        RETURNING k.n
    )
    SELECT coalesce(sum(c.n), 0)::int INTO n FROM counted c;
    INSERT INTO rabbitretry.alert (kind, group_key, error_type, error_message, count, detail)
    VALUES ('downstream', p_name, 'DownstreamUnavailable', left(p_error, 500), d.failures,
            jsonb_build_object('state', 'open', 'since', clock_timestamp(),
                               'forgiven', n));
    RETURN QUERY SELECT 'open'::text, d.failures, true, n;
END;
$$;

-- A call to downstream `p_name` succeeded: the failure count starts again; the probe's
-- success closes the breaker (and raises the "recovered" alert). Returns the state after.
CREATE FUNCTION rabbitretry.downstream_succeeded(p_name text, p_worker text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    d rabbitretry.downstream;
BEGIN
    SELECT * INTO d FROM rabbitretry.downstream x WHERE x.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'closed';
    END IF;
    IF d.state = 'closed' THEN
        UPDATE rabbitretry.downstream x
        SET failures = 0, first_failure_at = NULL, updated_at = now()
        WHERE x.name = p_name AND x.failures > 0;
        RETURN 'closed';
    END IF;
    IF d.state = 'open' OR d.probe_worker IS DISTINCT FROM p_worker THEN
        RETURN d.state;
    END IF;
    UPDATE rabbitretry.downstream x
    SET state = 'closed', since = clock_timestamp(), failures = 0, first_failure_at = NULL,
        pause_seconds = 0, next_probe_at = NULL, probe_worker = NULL, probe_until = NULL,
        updated_at = now()
    WHERE x.name = p_name;
    INSERT INTO rabbitretry.alert (kind, group_key, error_type, error_message, detail)
    VALUES ('downstream', p_name, 'DownstreamRecovered',
            p_name || ' answers again after ' || d.probes || ' failed probe(s)',
            jsonb_build_object('state', 'closed', 'since', clock_timestamp(),
                               'down_since', d.since, 'probes', d.probes));
    RETURN 'closed';
END;
$$;
