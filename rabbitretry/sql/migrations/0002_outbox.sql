-- The transactional outbox: messages written in the caller's transaction, relayed with
-- publisher confirms, marked sent only after the broker confirmed them.
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
