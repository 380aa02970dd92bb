-- Start marks are written once a handler has run a moment: the attempt log says so.
--
-- The worker used to send an attempt's start mark just before its handler, and marks of
-- concurrent attempts shared a statement, so a neighbour that ended the process in the turn
-- of the event loop between them left attempts charged whose handlers never ran. It now
-- writes the mark once the handler has run a moment (0.1 s): after its first step, always,
-- and not at all for a handler that ends sooner. An attempt found lapsed without its mark is
-- then one whose worker died before its handler started or in its first moment; this
-- migration only says so in the texts close_lapsed_attempt writes (the rule is 0016's: the
-- first four such deaths of a message are forgiven, and from the fifth on each counts).
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
                error_message = 'the attempt was never marked started (its worker died, '
                                'or lost the claim''s reply, before its handler had run a '
                                'moment); it is not counted'
            WHERE a.queue = p_queue AND a.message_id = p_message_id AND a.attempt = p_attempt;
            RETURN 'not-started';
        END IF;
        UPDATE rabbitretry.attempt a
        SET finished_at = now(), outcome = 'crashed', error_type = 'WorkerLost',
            error_message = format('the worker died before the attempt was marked '
                                   'started, %s times now (in the payload''s validation '
                                   'or the first moment of its handler, say); from the '
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
