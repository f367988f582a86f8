-- Admin reads and actions on jobs: one job, its stop flag, counts.

-- name: get_job :one
-- One job with every column, if its tenant is among the given keys (NULL: any tenant).
SELECT j.*, j.status::text AS status, t.key AS tenant_key
  FROM mdm.aa_job j JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE j.id = %(id)s
   AND (%(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[]));

-- name: stop_job :one
-- Set the manual stop flag `failed` on a job of the given tenants (NULL: any) that is not
-- finished, and audit it with the actor's tenant scope. A running job's id goes to the
-- `jobpool_stop` channel at commit: the worker holding it cancels its handler.
WITH target AS (
    SELECT id, status
      FROM mdm.aa_job
     WHERE id = %(id)s AND status IN ('pending', 'running', 'dlq')
       AND (%(tenants)s::text[] IS NULL
            OR tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
       FOR NO KEY UPDATE
), stopped AS (
    UPDATE mdm.aa_job j
       SET status = 'failed', completed_at = clock_timestamp(),
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL,
           -- why it is failed, where `jobs show` and the console look first
           last_error = left('stopped by ' || %(actor)s::text
                             || coalesce(' (its last error: ' || j.last_error || ')', ''), 4096)
      FROM target
     WHERE j.id = target.id
    RETURNING j.id, j.tenant_id, j.job_kind, target.status::text AS was
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_stop',
           jsonb_build_object('kind', job_kind, 'tenant_scope', %(scope)s::jsonb)
      FROM stopped
), notified AS (
    SELECT pg_notify('jobpool_stop', id::text) FROM stopped WHERE was = 'running'
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM stopped;

-- name: job_counts :many
-- Job counts per tenant, kind and status (finished jobs included), of the tenants with the
-- given keys (NULL: every tenant).
SELECT t.key AS tenant_key, j.tenant_id, j.job_kind, j.status::text AS status,
       count(*)::bigint AS jobs
  FROM mdm.aa_job j JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE %(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[])
 GROUP BY t.key, j.tenant_id, j.job_kind, j.status
 ORDER BY t.key, j.job_kind, j.status;
