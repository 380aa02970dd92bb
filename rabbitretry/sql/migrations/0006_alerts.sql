-- Alerts: stored before they are sent, so none is lost while the webhook is down.
--
-- status   meaning
-- open     a dead-letter alert still collecting deaths of its fingerprint (its window is open)
-- pending  waiting for (another) delivery try at next_try_at
-- sent     the webhook accepted it
CREATE TABLE rabbitretry.alert (
    id             bigserial   PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('dead', 'heartbeat', 'backlog')),
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
