-- A claim's lease counts from the moment it is granted, not from when its statement began.
-- now() is the start of the transaction: a claim that waited for the row's lock longer than its
-- lease (another attempt's final write, a batch of claims) got a lease that had already run out
-- when it committed, and a second worker could take the message while the first still ran it.
-- The lease, and the busy and due checks, now use clock_timestamp(), read after the lock.

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
        -- The lease ran out: the worker that held it died (or stalled) inside the attempt.
        UPDATE rabbitretry.attempt a
        SET finished_at = now(), outcome = 'crashed', error_type = 'WorkerLost',
            error_message = 'the worker stopped renewing its lease before the attempt finished'
        WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = r.attempts
          AND a.outcome IS NULL;
    END IF;

    IF r.attempts - r.attempts_forgiven >= p_max_attempts THEN
        UPDATE rabbitretry.ledger l
        SET status = 'dead', finished_at = now(), updated_at = now(), lease_until = NULL,
            next_retry_at = NULL, max_attempts = p_max_attempts,
            reason = CASE WHEN r.status = 'processing' THEN 'crashed'
                          ELSE 'attempts-exhausted' END,
            error_type = CASE WHEN r.status = 'processing' THEN 'WorkerLost'
                              ELSE l.error_type END,
            error_message = CASE WHEN r.status = 'processing'
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
