-- One row per attempt: the open attempt lives on its ledger row, the attempt log keeps the
-- attempts that ended otherwise than in success.
--
-- Every message used to write two rows before its handler ran (the ledger row and an open
-- attempt-log row) and update both when it succeeded: six index entries, two heap inserts and
-- a foreign-key lock per message, about 600 of its 1,465 bytes of WAL. Now the claim writes
-- who runs the attempt and since when on the ledger row (worker, attempt_started_at,
-- handler_started_at); a success only updates that row; an attempt that ends any other way
-- (retry, dead, skipped, crashed, interrupted, deferred) is appended to the attempt log when it
-- ends, with the same columns as before. The view attempt_history shows every attempt as the
-- log did: the logged ones, and the last one from the ledger row while it runs or once it
-- succeeded.
--
-- Rows written before this migration keep their attempt-log rows (attempt_started_at stays
-- NULL on them, so the view does not show their success twice). The attempts open now move to
-- their ledger rows. Restart the workers after migrating: a worker of an earlier version keeps
-- its messages safe, but the attempts it closes are missing from the history.

ALTER TABLE rabbitretry.ledger
    ADD COLUMN worker text,
    ADD COLUMN attempt_started_at timestamptz,
    ADD COLUMN handler_started_at timestamptz;

UPDATE rabbitretry.ledger l
SET worker = a.worker, attempt_started_at = a.started_at,
    handler_started_at = a.handler_started_at
FROM rabbitretry.attempt a
WHERE l.status = 'processing' AND a.queue = l.queue AND a.message_id = l.message_id
  AND a.attempt = l.attempts AND a.outcome IS NULL;

DELETE FROM rabbitretry.attempt a
USING rabbitretry.ledger l
WHERE l.status = 'processing' AND a.queue = l.queue AND a.message_id = l.message_id
  AND a.attempt = l.attempts AND a.outcome IS NULL;

CREATE VIEW rabbitretry.attempt_history AS
SELECT a.queue, a.message_id, a.attempt, a.started_at, a.finished_at, a.outcome, a.error_type,
       a.error_message, a.error_traceback, a.retry_at, a.worker, a.handler_started_at,
       a.downstream
FROM rabbitretry.attempt a
UNION ALL
SELECT l.queue, l.message_id, l.attempts, l.attempt_started_at,
       CASE WHEN l.status = 'succeeded' THEN l.finished_at END,
       CASE WHEN l.status = 'succeeded' THEN 'succeeded' END,
       NULL, NULL, NULL, NULL, l.worker, l.handler_started_at, NULL
FROM rabbitretry.ledger l
WHERE l.attempt_started_at IS NOT NULL AND l.status IN ('processing', 'succeeded');

-- Close the open attempt `p_attempt` of a key whose lease ran out, appending it to the attempt
-- log: 'crashed' (WorkerLost) when it was marked started (its handler had run a moment, 0.1 s,
-- when the worker died or stalled: it counts, so that a message that kills its worker ends
-- dead), 'not-started' when it was not (the worker died, or lost the claim's reply, before
-- that: logged interrupted, NotStarted; the caller forgives it), NULL when the attempt was not
-- open. A key's first four attempts found not started are forgiven; from the fifth on each
-- counts (crashed), so that a message that kills its worker before the mark (in its
-- validation, or in its handler's first moment) ends dead too. Only the attempt log is
-- written; the caller holds the ledger row's lock and updates it.
CREATE OR REPLACE FUNCTION rabbitretry.close_lapsed_attempt(
    p_queue text, p_message_id text, p_attempt integer
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r rabbitretry.ledger%ROWTYPE;
    not_started integer;  -- earlier attempts of the key found not started
    forgiven_at_most constant integer := 4;  -- the fifth counts (the text below says so)
    v_outcome text := 'crashed';
    v_error_type text := 'WorkerLost';
    v_message text := 'the worker stopped renewing its lease before the attempt finished';
BEGIN
    -- Open: the row's last attempt, not logged yet (whatever the status the caller is
    -- writing in the same statement).
    SELECT * INTO r FROM rabbitretry.ledger l
    WHERE l.queue = p_queue AND l.message_id = p_message_id AND l.attempts = p_attempt
      AND p_attempt >= 1
      AND NOT EXISTS (SELECT 1 FROM rabbitretry.attempt a
                      WHERE a.queue = p_queue AND a.message_id = p_message_id
                        AND a.attempt = p_attempt);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF r.handler_started_at IS NULL THEN
        SELECT count(*) INTO not_started FROM rabbitretry.attempt a
        WHERE a.queue = p_queue AND a.message_id = p_message_id
          AND a.error_type = 'NotStarted';
        IF not_started < forgiven_at_most THEN
            v_outcome := 'interrupted';
            v_error_type := 'NotStarted';
            v_message := 'the attempt was never marked started (its worker died, or lost the '
                       'claim''s reply, before its handler had run a moment); it is not '
                       'counted';
        ELSE
            v_message := format('the worker died before the attempt was marked started, %s '
                              'times now (in the payload''s validation or the first moment '
                              'of its handler, say); from the fifth on, each time counts, '
                              'so that the loop ends', not_started + 1);
        END IF;
    END IF;
    INSERT INTO rabbitretry.attempt (queue, message_id, attempt, started_at, finished_at,
                                     outcome, error_type, error_message, worker,
                                     handler_started_at)
    VALUES (p_queue, p_message_id, p_attempt, coalesce(r.attempt_started_at, r.updated_at),
            now(), v_outcome, v_error_type, v_message, coalesce(r.worker, 'unknown'),
            r.handler_started_at);
    RETURN CASE WHEN v_outcome = 'interrupted' THEN 'not-started' ELSE 'crashed' END;
END;
$$;

CREATE OR REPLACE FUNCTION rabbitretry.claim(
    p_queue text, p_message_id text, p_max_attempts integer, p_lease_seconds double precision,
    p_worker text, p_copy_attempts integer,
    p_payload bytea, p_headers jsonb, p_properties jsonb, p_exchange text, p_routing_key text
) RETURNS TABLE (verdict text, attempt integer, budget_attempt integer,
                 wait_seconds double precision, status text)
LANGUAGE plpgsql AS $$
DECLARE
    r rabbitretry.ledger%ROWTYPE;
    lease timestamptz := clock_timestamp() + make_interval(secs => p_lease_seconds);
    lapsed text;  -- how the attempt whose lease ran out was closed
BEGIN
    INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts, max_attempts,
                                         lease_until, payload, headers, properties, exchange,
                                         routing_key, worker, attempt_started_at)
    VALUES (p_queue, p_message_id, 'processing', 1, p_max_attempts, lease, p_payload, p_headers,
            p_properties, p_exchange, p_routing_key, p_worker, now())
    ON CONFLICT (queue, message_id) DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT 'claimed'::text, 1, 1, 0::float8, 'processing'::text;
        RETURN;
    END IF;

    SELECT * INTO r FROM rabbitretry.ledger l
    WHERE l.queue = p_queue AND l.message_id = p_message_id FOR UPDATE;
    -- The row lock may have been waited for (another attempt's final write, a batch): the
    -- lease and the due checks count from this moment, not from when the statement began.
    lease := clock_timestamp() + make_interval(secs => p_lease_seconds);

    IF r.status IN ('succeeded', 'dead', 'skipped', 'ignored') THEN
        RETURN QUERY SELECT 'finished'::text, r.attempts, r.attempts - r.attempts_forgiven,
                            0::float8, r.status;
        RETURN;
    END IF;
    IF r.status = 'processing' AND r.lease_until > clock_timestamp() THEN
        RETURN QUERY SELECT 'busy'::text, r.attempts, r.attempts - r.attempts_forgiven,
                            extract(epoch FROM r.lease_until - clock_timestamp())::float8, r.status;
        RETURN;
    END IF;
    IF r.status = 'retrying' AND r.next_retry_at > clock_timestamp() THEN
        RETURN QUERY SELECT
            CASE WHEN p_copy_attempts < r.attempts AND r.retry_copy_confirmed
                 THEN 'stale' ELSE 'not-due' END,
            r.attempts, r.attempts - r.attempts_forgiven,
            extract(epoch FROM r.next_retry_at - clock_timestamp())::float8, r.status;
        RETURN;
    END IF;

    IF r.status = 'processing' THEN
        -- The lease ran out. An attempt whose handler never started is not counted.
        lapsed := rabbitretry.close_lapsed_attempt(p_queue, p_message_id, r.attempts);
        IF lapsed = 'not-started' THEN
            UPDATE rabbitretry.ledger l SET attempts_forgiven = l.attempts_forgiven + 1
            WHERE l.queue = p_queue AND l.message_id = p_message_id;
            r.attempts_forgiven := r.attempts_forgiven + 1;
        END IF;
    END IF;

    IF r.attempts - r.attempts_forgiven >= p_max_attempts THEN
        UPDATE rabbitretry.ledger l
        SET status = 'dead', finished_at = now(), updated_at = now(), lease_until = NULL,
            next_retry_at = NULL, max_attempts = p_max_attempts,
            reason = CASE WHEN lapsed = 'crashed' THEN 'crashed'
                          ELSE 'attempts-exhausted' END,
            error_type = CASE WHEN lapsed = 'crashed' THEN 'WorkerLost'
                              ELSE l.error_type END,
            error_message = CASE WHEN lapsed = 'crashed'
                THEN 'the worker died during the last allowed attempt'
                ELSE l.error_message END
        WHERE l.queue = p_queue AND l.message_id = p_message_id;
        RETURN QUERY SELECT 'exhausted'::text, r.attempts, r.attempts - r.attempts_forgiven,
                            0::float8, 'dead'::text;
        RETURN;
    END IF;

    UPDATE rabbitretry.ledger l
    SET attempts = l.attempts + 1, status = 'processing', lease_until = lease,
        next_retry_at = NULL, retry_copy_confirmed = false, max_attempts = p_max_attempts,
        updated_at = now(), worker = p_worker, attempt_started_at = now(),
        handler_started_at = NULL
    WHERE l.queue = p_queue AND l.message_id = p_message_id;
    RETURN QUERY SELECT 'claimed'::text, r.attempts + 1, r.attempts + 1 - r.attempts_forgiven,
                        0::float8, 'processing'::text;
END;
$$;
