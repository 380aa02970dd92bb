-- The start mark and the finish of an attempt are HOT updates again.
--
-- attempt_downstream_idx (0011) had finished_at as a key and outcome in its predicate, which
-- every attempt's finish changes: each finish then wrote a new entry into every index of the
-- attempt log instead of updating the row in place. Migration 0015 rebuilds the index on what
-- the failure that it serves sets once (downstream, retry_at), without blocking the workers;
-- the attempt log now leaves a fifth of each page free, so that an attempt's start mark and
-- finish find room beside the row (a setting for new pages: no rewrite, no long lock).

ALTER TABLE rabbitretry.attempt SET (fillfactor = 80);

CREATE OR REPLACE FUNCTION rabbitretry.downstream_failed(
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
          -- retry_at (when the retry was due) is never before finished_at: the index's key
          AND a.retry_at >= clock_timestamp() - make_interval(secs => p_window)
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
