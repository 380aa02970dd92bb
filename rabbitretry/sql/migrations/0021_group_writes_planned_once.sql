-- The commit groups' statements (rabbitretry/ledger/commits.py: many claims, success marks or
-- start marks in one statement over arrays) were planned again at every execution. A prepared
-- statement gets a generic plan once its custom plans cost no less; but a custom plan sees the
-- arrays' values, so it counts their elements (a group of 4), while the generic plan assumes 10,
-- and under 10 elements the custom plan always looked cheaper. Planning a group of 4 claims cost
-- the server about 75 µs each time, a group of 4 success marks about 150: a quarter of its CPU
-- per message for groups of 4.
--
-- Each group statement is now a function that forces the generic plan of its body (the plan is
-- kept with the session, as for any PL/pgSQL statement); what calls it has the same plan for any
-- group size. The setting is the function's own: nothing else a session runs is affected.

CREATE FUNCTION rabbitretry.claim_many(
    p_queues text[], p_message_ids text[], p_max_attempts integer[],
    p_lease_seconds double precision[], p_workers text[], p_copy_attempts integer[],
    p_payloads bytea[], p_headers jsonb[], p_properties jsonb[], p_exchanges text[],
    p_routing_keys text[]
) RETURNS TABLE (ord bigint, verdict text, attempt integer, budget_attempt integer,
                 wait_seconds double precision, status text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    -- Claimed in the order given: callers sort by key, so that two groups lock rows in the
    -- same order.
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
                                         i.routing_key) AS c;
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
