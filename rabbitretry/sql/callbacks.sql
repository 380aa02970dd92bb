-- Third-party callbacks: the receiver's store and the state machine's history.

-- name: callback_store
-- One statement, one commit: the receipt and, only when the receipt is new, the outbox row
-- that the relay publishes (woken by the notification at commit). No row: a duplicate.
WITH receipt AS (
    INSERT INTO rabbitretry.callback_receipt (kind, message_id)
    VALUES ($1, $2)
    ON CONFLICT (kind, message_id) DO NOTHING
    RETURNING message_id
), queued AS (
    INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload, headers,
                                    content_type)
    SELECT '', $3, message_id, $4, $5, $6 FROM receipt
    RETURNING id
)
SELECT queued.id FROM queued, LATERAL (SELECT pg_notify('rabbitretry_outbox', '')) AS woken;

-- name: state_transition_record
INSERT INTO rabbitretry.state_transition (machine, record_key, from_state, to_state, outcome,
                                          message_id)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: state_transition_history
SELECT at, from_state, to_state, outcome, message_id
FROM rabbitretry.state_transition
WHERE machine = $1 AND record_key = $2
ORDER BY id;
