-- The dead-letter queue: list, replay, discard.

-- name: list_dlq :many
-- DLQ jobs after a keyset cursor, optionally for one tenant and kind, oldest first, of the tenants with the given keys (NULL: any tenant), with previews of their payloads and errors.
-- A row's size does not depend on its payload's: both texts are cut here, so big values
-- never leave the server, and a payload is rendered only when it is stored in at most
-- preview_read_limit bytes (a bigger one would be read whole to cut a preview from it; its
-- preview is NULL). payload_size: the bytes it is stored in (compressed), read without it.
SELECT d.id, d.tenant_id, t.key AS tenant_key, d.job_kind,
       CASE WHEN pg_column_size(d.payload) <= %(preview_read_limit)s
            THEN left(d.payload::text, %(preview_chars)s) END AS payload_preview,
       pg_column_size(d.payload) AS payload_size,
       CASE WHEN pg_column_size(d.payload) <= %(preview_read_limit)s
            THEN length(d.payload::text) > %(preview_chars)s ELSE true END AS payload_truncated,
       left(d.last_error, %(error_chars)s) AS last_error_preview,
       coalesce(length(d.last_error), 0) AS last_error_length,
       coalesce(length(d.last_error) > %(error_chars)s, false) AS last_error_truncated,
       d.attempts, d.max_attempts, d.created_at, d.dlq_at
  FROM mdm.v_job_dlq d JOIN mdm.aa_tenant t ON t.id = d.tenant_id
 WHERE d.id > %(after)s
   AND (%(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[]))
   AND (%(tenant_id)s::uuid IS NULL OR d.tenant_id = %(tenant_id)s::uuid)
   AND (%(kind)s::text IS NULL OR d.job_kind = %(kind)s::text)
 ORDER BY d.id
 LIMIT %(limit)s;

-- name: replay_job :one
-- Put a DLQ job of the given tenants (NULL: any) back to pending with fresh attempts, and
-- audit the replay with the actor's tenant scope.
WITH replayed AS (
    UPDATE mdm.aa_job
       SET status = 'pending', attempts = 0, available_at = now(), completed_at = NULL,
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL
     WHERE id = %(id)s AND status = 'dlq'
       AND (%(tenants)s::text[] IS NULL
            OR tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
    RETURNING id, tenant_id, job_kind, last_error
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_replay',
           jsonb_build_object('kind', job_kind, 'last_error', last_error,
                              'tenant_scope', %(scope)s::jsonb)
      FROM replayed
), notified AS (
    -- wake idle workers at commit, as an enqueue does
    SELECT pg_notify('jobpool', job_kind) FROM replayed
)
SELECT id FROM replayed, (SELECT count(*) FROM notified) AS n;

-- name: discard_job :one
-- Delete a DLQ or stopped job of the given tenants (NULL: any), and audit it with a snapshot
-- of the row and the actor's tenant scope.
WITH discarded AS (
    DELETE FROM mdm.aa_job
     WHERE id = %(id)s AND status IN ('dlq', 'failed')
       AND (%(tenants)s::text[] IS NULL
            OR tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
    RETURNING *
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_discard',
           to_jsonb(discarded) || jsonb_build_object('tenant_scope', %(scope)s::jsonb)
      FROM discarded
)
SELECT id FROM discarded;
