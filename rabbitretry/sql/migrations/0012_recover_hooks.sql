-- Recover hooks (Consumer.on_dead): a message of a queue with a hook that ends dead gets a
-- pending run of the hook, written in the transaction that makes it dead, whichever statement
-- does: an outbox row for the queue's recover queue, under the id
-- recover:<message_id>:<replays>, so that a replayed message that dies again runs it again.
-- The relay (or the reconciler) publishes it; a worker takes it like any message: claimed,
-- retried with backoff, committed exactly once.

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
