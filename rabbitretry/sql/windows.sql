-- Expected-vs-actual checks of the reconciler (see rabbitretry/reconcile/windows.py): which
-- expected keys the ledger knows, orphans, and the claims that keep two reconcilers from
-- republishing one missing key. Its ledger writes are in repairs.sql.

-- name: reconcile_key_statuses
-- The ledger status of each of the keys $2 in queue $1 (keys never seen have no row); a
-- compacted key is succeeded.
SELECT message_id, status FROM rabbitretry.ledger
WHERE queue = $1 AND message_id = ANY($2::text[])
UNION ALL
SELECT k.message_id, 'succeeded'
FROM unnest($2::text[]) AS k (message_id)
JOIN rabbitretry.succeeded_key s ON s.key_hash = rabbitretry.key_hash($1, k.message_id);

-- name: reconcile_orphans
-- Keys of queue $1 that succeeded in [$2, $3) but are not among the expected keys $4: how
-- many, and the first $5 of them. Served by ledger_succeeded_idx.
SELECT message_id, count(*) OVER ()::int AS total
FROM rabbitretry.ledger
WHERE status = 'succeeded' AND queue = $1 AND finished_at >= $2 AND finished_at < $3
  AND message_id <> ALL($4::text[])
ORDER BY finished_at
LIMIT $5;

-- name: reconcile_claim_republish
-- Of the missing keys $2 of queue $1, those this reconciler may re-publish now: never
-- re-published, or not within the last $4 seconds (doubling with each re-publication, up to
-- 64 × $4). The row is the claim, so two reconcilers never re-publish the same key at once.
INSERT INTO rabbitretry.reconciler_republished AS r (queue, message_id, reconciliation)
SELECT $1, key, $3 FROM unnest($2::text[]) AS key
ON CONFLICT (queue, message_id) DO UPDATE
SET republished_at = now(), times = r.times + 1, reconciliation = excluded.reconciliation
WHERE r.republished_at < now() - make_interval(secs => $4 * 2 ^ least(r.times - 1, 6))
RETURNING message_id;

-- name: reconcile_forget_republished
-- Re-publications of reconciliation $1 older than its look-back ($2 seconds): their keys are
-- outside every window it still checks, so the claim rows have done their work.
DELETE FROM rabbitretry.reconciler_republished
WHERE reconciliation = $1 AND republished_at < now() - make_interval(secs => $2);
