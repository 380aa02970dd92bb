-- Deaths before the handler starts are forgiven a bounded number of times.
--
-- An attempt whose lease ran out before its start mark is forgiven (0010): its handler never
-- ran. But the work between the claim and the mark (the payload's parsing and validation, the
-- consumer's should_skip) is code too, and a message that kills its worker there every time
-- (a validator that crashes the interpreter, a payload that runs it out of memory) was
-- forgiven every time: a crash loop the attempt count never ended. Now a message's first
-- four attempts found not started are forgiven, and from the fifth on each one counts
-- (crashed, WorkerLost), so that such a message ends dead like one whose handler kills its
-- worker.
CREATE OR REPLACE FUNCTION rabbitretry.close_lapsed_attempt(
    p_queue text, p_message_id text, p_attempt integer
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz;
    not_started integer;  -- earlier attempts of the key found not started
    forgiven_at_most constant integer := 4;  -- the fifth counts (the text below says so)
BEGIN
    SELECT a.handler_started_at INTO started FROM rabbitretry.attempt a
    WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt
      AND a.outcome IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF started IS NULL THEN
        SELECT count(*) INTO not_started FROM rabbitretry.attempt a
        WHERE a.queue = p_queue AND a.message_id = p_message_id
          AND a.error_type = 'NotStarted';
        IF not_started < forgiven_at_most THEN
            UPDATE rabbitretry.attempt a
            SET finished_at = now(), outcome = 'interrupted', error_type = 'NotStarted',
                error_message = 'the handler never started (its worker died, or lost the '
                                'claim''s reply, first); it is not counted'
            WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt;
            RETURN 'not-started';
        END IF;
        UPDATE rabbitretry.attempt a
        SET finished_at = now(), outcome = 'crashed', error_type = 'WorkerLost',
            error_message = format('the worker died before its handler started, %s times '
                                   'now (in the payload''s validation, say); from the '
                                   'fifth on, each time counts, so that the loop ends',
                                   not_started + 1)
        WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt;
        RETURN 'crashed';
    END IF;
    UPDATE rabbitretry.attempt a
    SET finished_at = now(), outcome = 'crashed', error_type = 'WorkerLost',
        error_message = 'the worker stopped renewing its lease before the attempt finished'
    WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt;
    RETURN 'crashed';
END;
$$;
