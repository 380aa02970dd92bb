-- Third-party callbacks: one receipt per callback (its kind and business message id), so that
-- a gateway's retries store one outbox row; and the history of a state machine's records.
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
