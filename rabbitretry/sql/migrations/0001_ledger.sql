-- The ledger: one row per (queue, message_id), the single source of truth for a message.
CREATE SCHEMA IF NOT EXISTS rabbitretry;

CREATE TABLE rabbitretry.ledger (
    queue                text        NOT NULL,
    message_id           text        NOT NULL,
    status               text        NOT NULL CHECK (status IN
                             ('processing', 'retrying', 'succeeded', 'dead', 'skipped', 'ignored')),
    -- attempts always equals the number of rabbitretry.attempt rows for the key;
    -- attempts_forgiven are those that do not count against max_attempts
    -- (interrupted by a shutdown, or made before a replay granted a fresh budget).
    attempts             integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    attempts_forgiven    integer     NOT NULL DEFAULT 0 CHECK (attempts_forgiven >= 0),
    max_attempts         integer     NOT NULL CHECK (max_attempts >= 1),
    next_retry_at        timestamptz,
    retry_copy_confirmed boolean     NOT NULL DEFAULT false,
    lease_until          timestamptz,
    first_seen           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    finished_at          timestamptz,
    reason               text,
    error_type           text,
    error_message        text,
    error_traceback      text,
    error_fingerprint    text,
    payload              bytea       NOT NULL,
    headers              jsonb       NOT NULL DEFAULT '{}',
    properties           jsonb       NOT NULL DEFAULT '{}',
    exchange             text        NOT NULL DEFAULT '',
    routing_key          text        NOT NULL DEFAULT '',
    replays              integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, message_id),
    CHECK (status <> 'retrying' OR next_retry_at IS NOT NULL),
    CHECK (status <> 'processing' OR lease_until IS NOT NULL)
);

-- Served scans: dead letters by queue and age, retries coming due, leases running out.
CREATE INDEX ledger_dead_idx ON rabbitretry.ledger (queue, finished_at) WHERE status = 'dead';
CREATE INDEX ledger_retry_due_idx ON rabbitretry.ledger (next_retry_at) WHERE status = 'retrying';
CREATE INDEX ledger_lease_idx ON rabbitretry.ledger (lease_until) WHERE status = 'processing';

-- Append-only: one row per attempt, written in the same transaction that counts it.
CREATE TABLE rabbitretry.attempt (
    queue           text        NOT NULL,
    message_id      text        NOT NULL,
    attempt         integer     NOT NULL CHECK (attempt >= 1),
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    outcome         text CHECK (outcome IN
                        ('succeeded', 'retry', 'dead', 'crashed', 'interrupted', 'skipped')),
    error_type      text,
    error_message   text,
    error_traceback text,
    retry_at        timestamptz,  -- when the next attempt was scheduled for (outcome retry)
    worker          text        NOT NULL,
    PRIMARY KEY (queue, message_id, attempt),
    FOREIGN KEY (queue, message_id) REFERENCES rabbitretry.ledger (queue, message_id)
        ON DELETE CASCADE
);

-- Who replayed or ignored what, and when.
CREATE TABLE rabbitretry.audit (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    action      text        NOT NULL,
    queue       text        NOT NULL,
    message_id  text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_key_idx ON rabbitretry.audit (queue, message_id);

-- Claim a delivery before its handler runs: one round trip, one transaction.
--
-- verdict   meaning                                               the worker then
-- claimed   attempt `attempt` is ours (lease set, attempt row)    runs the handler
-- finished  the work is done (status says how)                    acks and drops the copy
-- stale     an older copy whose successor is already parked       acks and drops the copy
-- busy      another attempt holds a live lease                    parks the copy wait_seconds
-- not-due   a retry that is not due yet                           parks the copy wait_seconds
-- exhausted the last attempt died with its worker: now dead       publishes the dead letter
CREATE FUNCTION rabbitretry.claim(
    p_queue text, p_message_id text, p_max_attempts integer, p_lease_seconds double precision,
    p_worker text, p_copy_attempts integer,
    p_payload bytea, p_headers jsonb, p_properties jsonb, p_exchange text, p_routing_key text
) RETURNS TABLE (verdict text, attempt integer, budget_attempt integer,
                 wait_seconds double precision, status text)
LANGUAGE plpgsql AS $$
DECLARE
    r rabbitretry.ledger%ROWTYPE;
    lease timestamptz := now() + make_interval(secs => p_lease_seconds);
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

    IF r.status IN ('succeeded', 'dead', 'skipped', 'ignored') THEN
        RETURN QUERY SELECT 'finished'::text, r.attempts, r.attempts - r.attempts_forgiven,
                            0::float8, r.status;
        RETURN;
    END IF;
    IF r.status = 'processing' AND r.lease_until > now() THEN
        RETURN QUERY SELECT 'busy'::text, r.attempts, r.attempts - r.attempts_forgiven,
                            extract(epoch FROM r.lease_until - now())::float8, r.status;
        RETURN;
    END IF;
    IF r.status = 'retrying' AND r.next_retry_at > now() THEN
        RETURN QUERY SELECT
            CASE WHEN p_copy_attempts < r.attempts AND r.retry_copy_confirmed
                 THEN 'stale' ELSE 'not-due' END,
            r.attempts, r.attempts - r.attempts_forgiven,
            extract(epoch FROM r.next_retry_at - now())::float8, r.status;
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
