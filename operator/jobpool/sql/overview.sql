-- Named queries of the operations overview (the admin API's /v1/overview and job history).

-- name: overview_counts :many
-- Live jobs per tenant, kind and status (pending, running, dlq) with ready ones, the oldest ready job's age in seconds and whether a pause holds the pair, of the tenants with the given keys (NULL: every tenant).
-- One branch per status, so that each reads its own partial index rather than the table
-- (done and stopped jobs are not read at all).
WITH live AS (
    SELECT tenant_id, job_kind, status, available_at FROM mdm.aa_job WHERE status = 'pending'
    UNION ALL
    SELECT tenant_id, job_kind, status, available_at FROM mdm.aa_job WHERE status = 'running'
    UNION ALL
    SELECT tenant_id, job_kind, status, available_at FROM mdm.aa_job WHERE status = 'dlq'
)
SELECT t.key AS tenant, j.tenant_id, j.job_kind AS kind, j.status::text AS status,
       count(*)::bigint AS jobs,
       count(*) FILTER (WHERE j.status = 'pending' AND j.available_at <= now())::bigint AS ready,
       coalesce(extract(epoch FROM now() - min(j.available_at)
                        FILTER (WHERE j.status = 'pending' AND j.available_at <= now())),
                0)::float8 AS ready_age_seconds,
       EXISTS (SELECT 1 FROM mdm.aa_pause p
                WHERE (p.tenant_id = j.tenant_id OR p.tenant_id IS NULL)
                  AND (p.job_kind = j.job_kind OR p.job_kind IS NULL)) AS paused
  FROM live j
  JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE %(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[])
 GROUP BY t.key, j.tenant_id, j.job_kind, j.status
 ORDER BY t.key, j.job_kind, j.status;

-- name: scoped_rate_limits :many
-- The rate_limit metadata (JSON text, NULL when unset) of the tenants with the given keys (NULL: every tenant).
SELECT id, key, (metadata -> 'rate_limit')::text AS rate_limit
  FROM mdm.aa_tenant
 WHERE metadata ? 'rate_limit'
   AND (%(tenants)s::text[] IS NULL OR key = ANY(%(tenants)s::text[]))
 ORDER BY key;

-- name: waiting_jobs :many
-- Pending jobs not yet due per tenant and kind (rate-limit requeues and retries) and when the first falls due, of the tenants with the given keys (NULL: every tenant).
SELECT t.key AS tenant, j.job_kind AS kind, count(*)::bigint AS waiting,
       min(j.available_at) AS next_due_at
  FROM mdm.aa_job j
  JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE j.status = 'pending' AND j.available_at > now()
   AND (%(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[]))
 GROUP BY t.key, j.job_kind;

-- name: job_history :many
-- The audit rows of one job, oldest first, with previews of their payloads, if its tenant is among the given keys (NULL: any tenant).
-- Previews as list_dlq's: a discard's payload holds the whole job (its own payload too).
SELECT a.id, a.at, a.actor_principal_id AS actor, a.action::text AS action,
       CASE WHEN pg_column_size(a.payload) <= %(preview_read_limit)s
            THEN left(a.payload::text, %(preview_chars)s) END AS payload_preview,
       pg_column_size(a.payload) AS payload_size,
       CASE WHEN pg_column_size(a.payload) <= %(preview_read_limit)s
            THEN length(a.payload::text) > %(preview_chars)s ELSE true END AS payload_truncated
  FROM mdm.aa_audit_log a
 WHERE a.job_id = %(id)s
   AND (%(tenants)s::text[] IS NULL
        OR a.tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
 ORDER BY a.id
 LIMIT %(limit)s;

-- name: audit_entry :one
-- One audit row with its whole payload, if its tenant is among the given keys (NULL: any tenant).
SELECT a.id, a.at, a.actor_principal_id AS actor, a.action::text AS action, a.job_id,
       a.payload
  FROM mdm.aa_audit_log a
 WHERE a.id = %(id)s
   AND (%(tenants)s::text[] IS NULL
        OR a.tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])));
