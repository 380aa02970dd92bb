-- An attempt counts only if its handler started.
--
-- A claim counts an attempt before the handler runs, so that a message whose handler kills its
-- worker ends dead. But a claim can commit and never reach its handler: the worker is killed
-- while the claim's reply is on its way, or the reply is lost with the connection in an outage
-- the worker gives up waiting for. Such a claim was charged as crashed (WorkerLost) once its
-- lease ran out: with max_attempts = 1, the message went dead without its handler ever running.
--
-- The worker now marks the attempt (handler_started_at) after the claim's reply and before the
-- handler starts. A claim that finds an expired lease on an attempt without the mark forgives
-- that attempt (outcome interrupted, error_type NotStarted) instead of charging it; the
-- reconciler's repairs close such an attempt the same way (rabbitretry.close_lapsed_attempt).
-- Attempts open when this migration runs are taken as started, as before.

ALTER TABLE rabbitretry.attempt ADD COLUMN handler_started_at timestamptz;
UPDATE rabbitretry.attempt SET handler_started_at = started_at WHERE outcome IS NULL;

-- Close the open attempt `p_attempt` of a key whose lease ran out: 'crashed' (WorkerLost) when
-- its handler had started (the worker died or stalled inside it: it counts, so that a message
-- that kills its worker ends dead), 'not-started' when it had not (the worker died, or lost
-- the claim's reply, first: logged interrupted, NotStarted; the caller forgives it), NULL when
-- the attempt was not open. Only the attempt log is written.
CREATE FUNCTION rabbitretry.close_lapsed_attempt(
    p_queue text, p_message_id text, p_attempt integer
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz;
BEGIN
    SELECT a.handler_started_at INTO started FROM rabbitretry.attempt a
    WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt
      AND a.outcome IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF started IS NULL THEN
        UPDATE rabbitretry.attempt a
        SET finished_at = now(), outcome = 'interrupted', error_type = 'NotStarted',
            error_message = 'the handler never started (its worker died, or lost the claim''s '
                            'reply, first); it is not counted'
        WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt;
        RETURN 'not-started';
    END IF;
    UPDATE rabbitretry.attempt a
    SET finished_at = now(), outcome = 'crashed', error_type = 'WorkerLost',
        error_message = 'the worker stopped renewing its lease before the attempt finished'
    WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt;
    RETURN 'crashed';
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
                                         routing_key)
    VALUES (p_queue, p_message_id, 'processing', 1, p_max_attempts, lease, p_payload, p_headers,
            p_properties, p_exchange, p_routing_key)
    ON CONFLICT (queue, message_id) DO NOTHING;
    IF FOUND THEN
        INSERT INTO rabbitretry.attempt (queue, message_id, attempt, worker)
        VALUES (p_queue, p_message_id, 1, p_worker);
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
        updated_at = now()
    WHERE l.queue = p_queue AND l.message_id = p_message_id;
    INSERT INTO rabbitretry.attempt (queue, message_id, attempt, worker)
    VALUES (p_queue, p_message_id, r.attempts + 1, p_worker);
    RETURN QUERY SELECT 'claimed'::text, r.attempts + 1, r.attempts + 1 - r.attempts_forgiven,
                        0::float8, 'processing'::text;
END;
$$;
