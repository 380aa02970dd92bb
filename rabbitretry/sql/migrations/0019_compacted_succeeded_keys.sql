-- Compacted succeeded messages: after a window (`ledger prune --compact-after`, 7 days by
-- default) a succeeded message is moved out of the ledger into succeeded_key, which keeps a
-- 128-bit hash of its key, when it finished and how many attempts it took: about 130 bytes
-- with its indexes, against about 280 for its ledger row and index entries. That is what
-- deduplication needs: a late duplicate of a compacted key is dropped by the claim, which
-- looks the hash up whenever it creates a row. What goes with the ledger row: the message id
-- itself, its queue, its attempt log (attempts before the one that succeeded) and its snapshot.
-- Rows whose consumer keeps the snapshot (keep_payload = "always") are never compacted.

-- The key's hash: the first 16 bytes of the SHA-256 of the queue's length in UTF-8 bytes, the
-- queue and the message id (the length makes the split between the two unambiguous; counted in
-- bytes, it does not change with the database's encoding), as a uuid. Among ten billion keys,
-- two meet by chance with odds of about one in 10^18; making two meet on purpose takes some
-- 2^64 hashes.
CREATE FUNCTION rabbitretry.key_hash(p_queue text, p_message_id text) RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(substr(sha256(convert_to(
               octet_length(convert_to(p_queue, 'UTF8'))::text || ':' || p_queue || p_message_id,
               'UTF8')), 1, 16), 'hex')::uuid
$$;

CREATE TABLE rabbitretry.succeeded_key (
    key_hash    uuid        PRIMARY KEY,
    finished_at timestamptz NOT NULL,
    attempts    integer     NOT NULL
);
-- The prune takes old keys oldest first, batch by batch from where the last one ended.
CREATE INDEX succeeded_key_finished_idx ON rabbitretry.succeeded_key (finished_at);

-- The queues whose successes were compacted, and the end of the latest of them: the
-- reconciler's scan of dead-letter queues finds a work queue by its ledger rows, and a queue
-- whose rows were all compacted still has a dead-letter queue to watch until its keys expire.
CREATE TABLE rabbitretry.compacted_queue (
    queue            text        PRIMARY KEY,
    last_finished_at timestamptz NOT NULL
);

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
    LOOP
        INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts, max_attempts,
                                             lease_until, payload, headers, properties,
                                             exchange, routing_key, worker, attempt_started_at)
        VALUES (p_queue, p_message_id, 'processing', 1, p_max_attempts, lease, p_payload,
                p_headers, p_properties, p_exchange, p_routing_key, p_worker, now())
        ON CONFLICT (queue, message_id) DO NOTHING;
        IF FOUND THEN
            -- A new row, unless the key was compacted: its duplicate is dropped. Looked up
            -- after the insert, which waits for a compaction moving this key (its row) to
            -- commit, in a statement of its own that sees what that compaction wrote.
            SELECT s.attempts INTO r.attempts FROM rabbitretry.succeeded_key s
            WHERE s.key_hash = rabbitretry.key_hash(p_queue, p_message_id);
            IF FOUND THEN
                DELETE FROM rabbitretry.ledger l
                WHERE l.queue = p_queue AND l.message_id = p_message_id;
                RETURN QUERY SELECT 'finished'::text, r.attempts, r.attempts, 0::float8,
                                    'succeeded'::text;
                RETURN;
            END IF;
            RETURN QUERY SELECT 'claimed'::text, 1, 1, 0::float8, 'processing'::text;
            RETURN;
        END IF;
        SELECT * INTO r FROM rabbitretry.ledger l
        WHERE l.queue = p_queue AND l.message_id = p_message_id FOR UPDATE;
        -- The row the insert met is gone (a compaction or a prune removed it meanwhile): the
        -- insert is tried again, and now creates the row or meets a new one.
        EXIT WHEN FOUND;
    END LOOP;
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

-- A delivery refused before any attempt (no message_id, too large, an invalid callback),
-- stored dead: 1 when stored. A replayed copy refused again (its row is retrying) goes back to
-- dead; any other existing row, or a compacted key, is left alone and nothing is returned: the
-- copy is a duplicate. The key's row is locked first, in a statement of its own: a compaction
-- moving it is waited for, so the insert's check then sees the hash that compaction wrote.
CREATE FUNCTION rabbitretry.record_rejected(
    p_queue text, p_message_id text, p_max_attempts integer, p_reason text, p_error_type text,
    p_error_message text, p_fingerprint text, p_payload bytea, p_headers jsonb,
    p_properties jsonb, p_exchange text, p_routing_key text
) RETURNS SETOF integer LANGUAGE sql AS $$
    SELECT 1 FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2 FOR UPDATE;
    INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts, max_attempts,
                                         reason, error_type, error_message, error_fingerprint,
                                         finished_at, payload, headers, properties, exchange,
                                         routing_key)
    SELECT $1, $2, 'dead', 0, $3, $4, $5, $6, $7, now(), $8, $9, $10, $11, $12
    WHERE NOT EXISTS (SELECT FROM rabbitretry.succeeded_key
                      WHERE key_hash = rabbitretry.key_hash($1, $2))
    ON CONFLICT (queue, message_id) DO UPDATE
    SET status = 'dead', reason = excluded.reason, error_type = excluded.error_type,
        error_message = excluded.error_message, error_fingerprint = excluded.error_fingerprint,
        finished_at = now(), updated_at = now(), next_retry_at = NULL
    WHERE l.status = 'retrying'
    RETURNING 1;
$$;

-- Messages taken off work queue p_queue's dead-letter queue, stored dead with reason p_reason
-- (also their error type) and p_max_attempts, unless the ledger already has their key: any
-- existing row, terminal or still in flight, or a compacted key, is left exactly as it is
-- (the ledger decides). The keys inserted are returned. Two copies of one key in a batch make
-- one row; keys are locked, then inserted, in order, so reconcilers recording overlapping
-- batches at once cannot deadlock; the lock comes first, in a statement of its own, for the
-- reason record_rejected gives. Every insert raises the dead-letter alert through the
-- ledger_alert_on_dead trigger.
CREATE FUNCTION rabbitretry.record_broker_dead(
    p_queue text, p_max_attempts integer, p_reason text, p_message_ids text[],
    p_payloads bytea[], p_headers jsonb[], p_properties jsonb[], p_exchanges text[],
    p_routing_keys text[], p_error_messages text[], p_fingerprints text[]
) RETURNS SETOF text LANGUAGE sql AS $$
    SELECT 1 FROM rabbitretry.ledger
    WHERE queue = $1 AND message_id = ANY($4) ORDER BY message_id FOR UPDATE;
    INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts, max_attempts,
                                         reason, error_type, error_message, error_fingerprint,
                                         finished_at, payload, headers, properties, exchange,
                                         routing_key)
    SELECT DISTINCT ON (m.message_id)
           $1, m.message_id, 'dead', 0, $2, $3, $3, m.error_message, m.fingerprint, now(),
           m.payload, m.headers, m.properties, m.exchange, m.routing_key
    FROM unnest($4, $5, $6, $7, $8, $9, $10, $11)
         AS m (message_id, payload, headers, properties, exchange, routing_key, error_message,
               fingerprint)
    WHERE NOT EXISTS (SELECT FROM rabbitretry.succeeded_key
                      WHERE key_hash = rabbitretry.key_hash($1, m.message_id))
    ORDER BY m.message_id
    ON CONFLICT (queue, message_id) DO NOTHING
    RETURNING l.message_id;
$$;
