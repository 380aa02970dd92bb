-- A group of claims inserts the keys the ledger has never seen with one plain INSERT.
--
-- `claim` inserts a key's row with INSERT ... ON CONFLICT DO NOTHING, which makes the insert
-- speculative: PostgreSQL writes the row, checks the key's index, then writes a second WAL
-- record to confirm the row (48 bytes, about a twentieth of the WAL a message costs). Almost
-- every claim is of a new key, and a group of them needs no speculation: a key inserted
-- meanwhile by another transaction fails the INSERT with a unique violation (once that
-- transaction has committed), the group fails as a whole, and its caller then claims each key
-- on its own through `claim` (rabbitretry/ledger/commits.py). A key the group holds twice is
-- inserted once; its other claim meets that row in `claim`, as it would have in order.
--
-- A key is new when the statement sees neither its row nor its compacted hash. Both are read
-- in one snapshot: a compaction that moved the row is seen either whole (the hash) or not at
-- all (the row), never neither. Every other key goes through `claim`, in the order given.

CREATE OR REPLACE FUNCTION rabbitretry.claim_many(
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
