-- The ledger database of rabbitretry, whole: every table, index, constraint, function and
-- trigger of the schema `rabbitretry` as the migrations 0001 to 0022 leave it, in one file to
-- read (what is stored, and why) and to build an empty database from in one step:
--
--     psql --single-transaction -f rabbitretry/sql/schema.sql "$RABBITRETRY_DATABASE_URL"
--
-- A database built from it is at the latest version: its schema_migration rows (at the end)
-- say which migrations it stands for, so `rabbitretry db migrate` then applies nothing.
--
-- The migrations in sql/migrations/ stay the way a live database is upgraded; this file only
-- describes where they lead. A new migration changes this file too:
-- tests/integration/test_schema.py fails until a database built from it equals one built by
-- the migrations (columns, constraints, indexes, functions, triggers, schema_migration rows).
-- To regenerate it, migrate a scratch database and dump its schema,
--
--     pg_dump --schema-only --no-owner --no-privileges --schema=rabbitretry DATABASE_URL
--
-- then bring the change into this file by hand, in this layout (pg_dump's SET lines, its
-- separate sequences and ALTER TABLE ... ADD CONSTRAINT are not needed here, and it drops the
-- comments). Function bodies are kept exactly as the migrations wrote them: PostgreSQL stores
-- a body's text as written, and the comparison reads it. No statement here is loaded by name.

CREATE SCHEMA IF NOT EXISTS rabbitretry;


-- The ledger ---------------------------------------------------------------------------------

-- One row per (queue, message_id), the single source of truth for a message.
CREATE TABLE rabbitretry.ledger (
    queue                text        NOT NULL,
    message_id           text        NOT NULL,
    status               text        NOT NULL CHECK (status IN
                             ('processing', 'retrying', 'succeeded', 'dead', 'skipped', 'ignored')),
    -- attempts always equals the number of rabbitretry.attempt_history rows for the key;
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
    -- The snapshot a replay, a re-drive or a retry copy sends again: NULL once a message
    -- succeeded, unless its consumer keeps it (keep_payload = "always").
    payload              bytea,
    headers              jsonb       DEFAULT '{}',
    properties           jsonb       DEFAULT '{}',
    exchange             text        NOT NULL DEFAULT '',
    routing_key          text        NOT NULL DEFAULT '',
    replays              integer     NOT NULL DEFAULT 0,
    -- When the reconciler last re-published the row's snapshot. A row it re-drove is left
    -- alone for a grace period, so that two reconcilers never publish the same message twice
    -- and one reconciler does not flood a queue whose workers are down.
    redriven_at          timestamptz,
    redrives             integer     NOT NULL DEFAULT 0,
    -- The last attempt, while it runs and once it succeeded (the attempt log has the others):
    -- who runs it, since when, and since when its handler has run a moment (0.1 s; never
    -- set for one that ends sooner). NULL on rows finished before migration 0018, whose
    -- every attempt is in the log.
    worker               text,
    attempt_started_at   timestamptz,
    handler_started_at   timestamptz,
    PRIMARY KEY (queue, message_id),
    CONSTRAINT ledger_check CHECK (status <> 'retrying' OR next_retry_at IS NOT NULL),
    CONSTRAINT ledger_check1 CHECK (status <> 'processing' OR lease_until IS NOT NULL),
    CONSTRAINT ledger_snapshot_kept CHECK (
        status = 'succeeded' OR (payload IS NOT NULL AND headers IS NOT NULL
                                 AND properties IS NOT NULL)
    )
);

-- Served scans: dead letters by queue and age, retries coming due, leases running out. The
-- last two require their time (which the check constraints make true of all their rows) so
-- that a statement naming one key and its state looks it up by key: it cannot use them, and a
-- full scan of their dead entries (each claim adds one, each success leaves it) is not chosen.
CREATE INDEX ledger_dead_idx ON rabbitretry.ledger (queue, finished_at) WHERE status = 'dead';
CREATE INDEX ledger_retry_due_idx ON rabbitretry.ledger (next_retry_at)
    WHERE status = 'retrying' AND next_retry_at IS NOT NULL;
CREATE INDEX ledger_lease_idx ON rabbitretry.ledger (lease_until)
    WHERE status = 'processing' AND lease_until IS NOT NULL;
-- Orphan check of an expected-vs-actual reconciliation: what succeeded in a time window.
CREATE INDEX ledger_succeeded_idx ON rabbitretry.ledger (queue, finished_at)
    WHERE status = 'succeeded';
-- Listing and grouping by fingerprint scan only the rows an operator acts on.
CREATE INDEX ledger_fingerprint_idx ON rabbitretry.ledger (error_fingerprint, finished_at)
    WHERE status IN ('dead', 'retrying', 'ignored');
-- ledger prune's skipped and ignored rows (few, written once): found without a scan.
CREATE INDEX ledger_set_aside_idx ON rabbitretry.ledger (finished_at)
    WHERE status IN ('skipped', 'ignored');

-- Append-only: one row per attempt that ended otherwise than in success (retry, dead,
-- skipped, crashed, interrupted, deferred), written when it ends. The open attempt and a
-- successful one are on the ledger row (rows finished before migration 0018 have every
-- attempt here).
CREATE TABLE rabbitretry.attempt (
    queue           text        NOT NULL,
    message_id      text        NOT NULL,
    attempt         integer     NOT NULL CHECK (attempt >= 1),
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    -- deferred: its downstream's breaker was open; kept in the history, not counted
    outcome         text CHECK (outcome IN
                        ('succeeded', 'retry', 'dead', 'crashed', 'interrupted', 'skipped',
                         'deferred')),
    error_type      text,
    error_message   text,
    error_traceback text,
    retry_at        timestamptz,  -- when the next attempt was scheduled for (outcome retry)
    worker          text        NOT NULL,
    -- Set once the handler has run a moment (0.1 s; never for one that ends sooner): a lapsed
    -- attempt without it is not counted, four times at most (close_lapsed_attempt).
    handler_started_at timestamptz,
    -- The downstream whose unavailability failed the attempt (DownstreamUnavailable).
    downstream      text,
    PRIMARY KEY (queue, message_id, attempt),
    FOREIGN KEY (queue, message_id) REFERENCES rabbitretry.ledger (queue, message_id)
        ON DELETE CASCADE
) WITH (fillfactor = 80);

-- Every attempt of every message: the logged ones, and the last one from its ledger row while
-- it runs or once it succeeded.
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
CREATE FUNCTION rabbitretry.close_lapsed_attempt(
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

-- Succeeded messages compacted after a window (`ledger prune --compact-after`): a 128-bit hash
-- of the key, when it finished and how many attempts it took, enough for the claim to drop a
-- late duplicate (migration 0019 says what is given up). The hash: the first 16 bytes of the
-- SHA-256 of the queue's length in UTF-8 bytes, the queue and the message id (the length makes
-- the split between the two unambiguous).
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


-- The commit groups' statements (rabbitretry/ledger/commits.py), one function each so that
-- their bodies keep one generic plan per session whatever the size of the group: a custom
-- plan counts the arrays' elements and, under 10 of them, looks cheaper than the generic plan
-- every time, so the statement was planned again at each execution (migration 0021).
-- claim_many inserts the keys new to the ledger with one plain INSERT, not through `claim`'s
-- speculative insert (migration 0022 says why); a key inserted meanwhile elsewhere fails it.
CREATE FUNCTION rabbitretry.claim_many(
    p_queues text[], p_message_ids text[], p_max_attempts integer[],
    p_lease_seconds double precision[], p_workers text[], p_copy_attempts integer[],
    p_payloads bytea[], p_headers jsonb[], p_properties jsonb[], p_exchanges text[],
    p_routing_keys text[]
) RETURNS TABLE (ord bigint, verdict text, attempt integer, budget_attempt integer,
                 wait_seconds double precision, status text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    inserted bigint[];  -- the claims whose key this group inserted
BEGIN
    WITH i AS (
        SELECT * FROM unnest(p_queues, p_message_ids, p_max_attempts, p_lease_seconds,
                             p_workers, p_payloads, p_headers, p_properties, p_exchanges,
                             p_routing_keys)
             WITH ORDINALITY AS i(queue, message_id, max_attempts, lease_seconds, worker,
                                  payload, headers, properties, exchange, routing_key, ord)
    ), new_rows AS (
        INSERT INTO rabbitretry.ledger AS l (queue, message_id, status, attempts,
                                             max_attempts, lease_until, payload, headers,
                                             properties, exchange, routing_key, worker,
                                             attempt_started_at)
        SELECT DISTINCT ON (i.queue, i.message_id)
               i.queue, i.message_id, 'processing', 1, i.max_attempts,
               clock_timestamp() + make_interval(secs => i.lease_seconds), i.payload,
               i.headers, i.properties, i.exchange, i.routing_key, i.worker, now()
        FROM i
        -- Each key looked up on its own (a scalar subquery runs as written): as NOT EXISTS,
        -- the plan kept for the session could join the whole ledger.
        WHERE (SELECT 1 FROM rabbitretry.ledger e
               WHERE e.queue = i.queue AND e.message_id = i.message_id) IS NULL
          AND (SELECT 1 FROM rabbitretry.succeeded_key s
               WHERE s.key_hash = rabbitretry.key_hash(i.queue, i.message_id)) IS NULL
        ORDER BY i.queue, i.message_id, i.ord
        RETURNING l.queue, l.message_id
    )
    SELECT array_agg(first.ord) INTO inserted
    FROM (SELECT min(i.ord) AS ord FROM i JOIN new_rows n USING (queue, message_id)
          GROUP BY i.queue, i.message_id) first;

    RETURN QUERY
    SELECT n.ord, 'claimed'::text, 1, 1, 0::float8, 'processing'::text
    FROM unnest(inserted) AS n(ord);

    -- The others claimed in the order given: callers sort by key, so that two groups lock
    -- rows in the same order.
    RETURN QUERY
    SELECT i.ord, c.verdict, c.attempt, c.budget_attempt, c.wait_seconds, c.status
    FROM unnest(p_queues, p_message_ids, p_max_attempts, p_lease_seconds, p_workers,
                p_copy_attempts, p_payloads, p_headers, p_properties, p_exchanges,
                p_routing_keys)
         WITH ORDINALITY AS i(queue, message_id, max_attempts, lease_seconds, worker,
                              copy_attempts, payload, headers, properties, exchange,
                              routing_key, ord)
    CROSS JOIN LATERAL rabbitretry.claim(i.queue, i.message_id, i.max_attempts,
                                         i.lease_seconds, i.worker, i.copy_attempts,
                                         i.payload, i.headers, i.properties, i.exchange,
                                         i.routing_key) AS c
    WHERE i.ord <> ALL (coalesce(inserted, '{}'));
END;
$$;

-- The success marks of many attempts (as finish_attempt with status succeeded; p_keep: keep
-- each one's snapshot, else only the publish time of its properties stays). Returns the
-- attempts that were still current; one missing had lost its lease to another attempt.
CREATE FUNCTION rabbitretry.succeed_many(
    p_queues text[], p_message_ids text[], p_attempts integer[], p_keep boolean[]
) RETURNS TABLE (queue text, message_id text, attempt integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    UPDATE rabbitretry.ledger l
    SET status = 'succeeded', reason = NULL, error_type = NULL, error_message = NULL,
        error_traceback = NULL, error_fingerprint = NULL, finished_at = now(),
        updated_at = now(), lease_until = NULL, next_retry_at = NULL,
        payload = CASE WHEN i.keep THEN l.payload END,
        headers = CASE WHEN i.keep THEN l.headers END,
        properties = CASE
            WHEN i.keep THEN l.properties
            WHEN l.properties ? 'timestamp'
            THEN jsonb_build_object('timestamp', l.properties -> 'timestamp')
        END
    FROM unnest(p_queues, p_message_ids, p_attempts, p_keep)
         AS i(queue, message_id, attempt, keep)
    WHERE l.queue = i.queue AND l.message_id = i.message_id AND l.attempts = i.attempt
      AND l.status = 'processing'
    RETURNING l.queue, l.message_id, l.attempts;
END;
$$;

-- The start marks of many attempts (as mark_started). Returns the attempts still open; one
-- missing is no longer ours.
CREATE FUNCTION rabbitretry.mark_started_many(
    p_queues text[], p_message_ids text[], p_attempts integer[]
) RETURNS TABLE (queue text, message_id text, attempt integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    UPDATE rabbitretry.ledger l
    SET handler_started_at = clock_timestamp()
    FROM unnest(p_queues, p_message_ids, p_attempts) AS i(queue, message_id, attempt)
    WHERE l.queue = i.queue AND l.message_id = i.message_id AND l.attempts = i.attempt
      AND l.status = 'processing'
    RETURNING l.queue, l.message_id, l.attempts;
END;
$$;


-- Operator actions ---------------------------------------------------------------------------

-- Who replayed, ignored or exported what, and when, with the operator's comment. Rows for
-- whole operations (a group replay, an export) name no single message but say how many they
-- touched; the per-message rows of an action on many messages name it (their batch), so the
-- audit can show one row per operation (the batch's summary row, action `...-batch`) and still
-- list each message on demand.
CREATE TABLE rabbitretry.audit (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    action      text        NOT NULL,
    queue       text,
    message_id  text,
    detail      jsonb       NOT NULL DEFAULT '{}',
    messages    integer     NOT NULL DEFAULT 1 CHECK (messages >= 0),
    comment     text,
    batch       text
);
CREATE INDEX audit_key_idx ON rabbitretry.audit (queue, message_id);
CREATE INDEX audit_at_idx ON rabbitretry.audit (at DESC);
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


-- The outbox ---------------------------------------------------------------------------------

-- Messages written in the caller's transaction, relayed with publisher confirms, marked sent
-- only after the broker confirmed them.
CREATE TABLE rabbitretry.outbox (
    id            bigserial   PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    exchange      text        NOT NULL,
    routing_key   text        NOT NULL,
    message_id    text        NOT NULL,
    ordering_key  text,
    payload       bytea       NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}',
    content_type  text        NOT NULL DEFAULT 'application/json',
    status        text        NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'sent', 'failed')),
    tries         integer     NOT NULL DEFAULT 0,
    next_try_at   timestamptz NOT NULL DEFAULT now(),
    last_error    text,
    sent_at       timestamptz
);

-- The relay's scan: pending rows coming due, oldest first.
CREATE INDEX outbox_pending_idx ON rabbitretry.outbox (next_try_at, id) WHERE status = 'pending';
-- Per-key ordering: is an older row of the same key still pending?
CREATE INDEX outbox_ordering_idx ON rabbitretry.outbox (ordering_key, id)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;
CREATE INDEX outbox_failed_idx ON rabbitretry.outbox (created_at) WHERE status = 'failed';


-- Heartbeats, the reconciler and scheduled jobs ----------------------------------------------

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

-- Keys an expected-vs-actual reconciliation re-published because no delivery of them was ever
-- seen; the row makes the re-publication happen once per grace period, whatever the number
-- of reconcilers.
CREATE TABLE rabbitretry.reconciler_republished (
    queue           text        NOT NULL,
    message_id      text        NOT NULL,
    reconciliation  text        NOT NULL,
    republished_at  timestamptz NOT NULL DEFAULT now(),
    times           integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (queue, message_id)
);

-- Where a scheduled job got to: a job that crashed resumes from its last saved checkpoint.
CREATE TABLE rabbitretry.job_checkpoint (
    name        text        PRIMARY KEY,
    checkpoint  jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);


-- Alerts -------------------------------------------------------------------------------------

-- Stored before they are sent, so none is lost while the webhook is down.
--
-- status   meaning
-- open     a dead-letter alert still collecting deaths of its fingerprint (its window is open)
-- pending  waiting for (another) delivery try at next_try_at
-- sent     the webhook accepted it
CREATE TABLE rabbitretry.alert (
    id             bigserial   PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('dead', 'heartbeat', 'backlog',
                                                        'downstream')),
    group_key      text        NOT NULL,  -- error fingerprint, heartbeat name or queue
    queue          text,
    error_type     text,
    error_message  text,
    count          integer     NOT NULL DEFAULT 1 CHECK (count >= 1),
    sample_keys    text[]      NOT NULL DEFAULT '{}',
    first_seen     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now(),
    detail         jsonb       NOT NULL DEFAULT '{}',
    status         text        NOT NULL DEFAULT 'pending'
                               CHECK (status IN ('open', 'pending', 'sent')),
    tries          integer     NOT NULL DEFAULT 0,
    next_try_at    timestamptz NOT NULL DEFAULT now(),
    last_error     text,
    sent_at        timestamptz
);

-- At most one open alert per group: deaths of the same fingerprint join it.
CREATE UNIQUE INDEX alert_open_idx ON rabbitretry.alert (kind, group_key) WHERE status = 'open';
-- The deliverer's scans: open alerts whose window closed, pending alerts coming due.
CREATE INDEX alert_due_idx ON rabbitretry.alert (next_try_at) WHERE status = 'pending';
CREATE INDEX alert_first_seen_idx ON rabbitretry.alert (first_seen) WHERE status = 'open';
-- Repeat suppression for condition alerts (heartbeat, backlog), and the listing.
CREATE INDEX alert_group_idx ON rabbitretry.alert (kind, group_key, first_seen);

-- Every transition of a ledger row to `dead`, whichever statement makes it, joins the open
-- alert of its fingerprint in the same transaction: no dead letter escapes alerting.
CREATE FUNCTION rabbitretry.alert_on_dead() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'dead' THEN
        RETURN NULL;
    END IF;
    INSERT INTO rabbitretry.alert AS a (kind, group_key, queue, error_type, error_message,
                                        sample_keys, status, detail)
    VALUES ('dead',
            coalesce(NEW.error_fingerprint,
                     NEW.queue || ':' || coalesce(NEW.reason, '') || ':'
                     || coalesce(NEW.error_type, '')),
            NEW.queue, coalesce(NEW.error_type, NEW.reason), left(NEW.error_message, 500),
            ARRAY[NEW.message_id], 'open',
            jsonb_build_object('reason', NEW.reason, 'fingerprint', NEW.error_fingerprint))
    ON CONFLICT (kind, group_key) WHERE status = 'open' DO UPDATE
    SET count = a.count + 1,
        last_seen = now(),
        error_message = excluded.error_message,
        sample_keys = CASE WHEN cardinality(a.sample_keys) < 5
                                AND NOT NEW.message_id = ANY (a.sample_keys)
                           THEN a.sample_keys || NEW.message_id
                           ELSE a.sample_keys END;
    RETURN NULL;
END;
$$;

CREATE TRIGGER ledger_alert_on_dead
    AFTER INSERT OR UPDATE OF status ON rabbitretry.ledger
    FOR EACH ROW WHEN (NEW.status = 'dead')
    EXECUTE FUNCTION rabbitretry.alert_on_dead();


-- Third-party callbacks and state machines ---------------------------------------------------

-- One receipt per callback (its kind and business message id), so that a gateway's retries
-- store one outbox row.
CREATE TABLE rabbitretry.callback_receipt (
    kind         text        NOT NULL,
    message_id   text        NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, message_id)
);

-- Every transition a state machine made (moved) or refused (not-allowed), with the message
-- that asked for it.
CREATE TABLE rabbitretry.state_transition (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    machine      text        NOT NULL,
    record_key   text        NOT NULL,
    from_state   text,
    to_state     text        NOT NULL,
    outcome      text        NOT NULL CHECK (outcome IN ('moved', 'not-allowed')),
    message_id   text        NOT NULL
);
CREATE INDEX state_transition_record_idx
    ON rabbitretry.state_transition (machine, record_key, id);


-- The console --------------------------------------------------------------------------------

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


-- Downstream breakers ----------------------------------------------------------------------

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

-- The attempts a trip forgives: charged failures of one downstream, by when their retry was
-- due. Its columns are set once, by the failure, so that the start mark and the finish of
-- every other attempt stay HOT updates (no index entry written).
CREATE INDEX attempt_downstream_idx ON rabbitretry.attempt (downstream, retry_at)
    WHERE downstream IS NOT NULL;

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


-- Recover hooks -----------------------------------------------------------------------------

-- A message of a queue whose consumer has a recover hook (Consumer.on_dead) that ends dead gets
-- a pending run of the hook (an outbox row for <queue>.recover, id recover:<id>:<replays>),
-- in the transaction that makes it dead.
-- The queues whose consumers have a hook (a worker records its own when it starts).
CREATE TABLE rabbitretry.recover_hook (
    queue           text        PRIMARY KEY,
    recover_queue   text        NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION rabbitretry.recover_on_dead() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    target text;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status = 'dead' THEN
        RETURN NULL;
    END IF;
    SELECT h.recover_queue INTO target FROM rabbitretry.recover_hook h WHERE h.queue = NEW.queue;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- An AMQP message_id holds 255 bytes: a long id is hashed (the header keeps it whole).
    INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload, headers)
    VALUES ('', target,
            'recover:' || CASE WHEN octet_length(NEW.message_id) > 200
                               THEN 'md5-' || md5(NEW.message_id) ELSE NEW.message_id END
                       || ':' || NEW.replays,
            NEW.payload,
            jsonb_build_object(
                'x-rabbitretry-recover-of', NEW.message_id,
                'x-rabbitretry-dead-reason', coalesce(NEW.reason, ''),
                'x-rabbitretry-dead-error-type', coalesce(NEW.error_type, ''),
                'x-rabbitretry-dead-error', left(coalesce(NEW.error_message, ''), 2000),
                'x-rabbitretry-dead-attempts', NEW.attempts - NEW.attempts_forgiven));
    PERFORM pg_notify('rabbitretry_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER ledger_recover_on_dead
    AFTER INSERT OR UPDATE OF status ON rabbitretry.ledger
    FOR EACH ROW WHEN (NEW.status = 'dead')
    EXECUTE FUNCTION rabbitretry.recover_on_dead();


-- Migrations ---------------------------------------------------------------------------------

-- The migrations applied (rabbitretry.db.migrate writes a row per migration); these rows say
-- that this schema stands for migrations 0001 to 0022.
CREATE TABLE rabbitretry.schema_migration (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO rabbitretry.schema_migration (version, name) VALUES
    (1, 'ledger'),
    (2, 'outbox'),
    (3, 'heartbeat'),
    (4, 'reconciler'),
    (5, 'operations'),
    (6, 'alerts'),
    (7, 'callbacks'),
    (8, 'console'),
    (9, 'claim_lease'),
    (10, 'handler_started'),
    (11, 'downstreams'),
    (12, 'recover_hooks'),
    (13, 'hot_attempts'),
    (14, 'snapshot_until_success'),
    (15, 'online_indexes'),
    (16, 'unstarted_deaths'),
    (17, 'late_start_marks'),
    (18, 'one_row_per_attempt'),
    (19, 'compacted_succeeded_keys'),
    (20, 'key_lookups_by_key'),
    (21, 'group_writes_planned_once'),
    (22, 'new_keys_inserted_plainly');
