-- Enqueueing jobs. Parameters are psycopg's %(name)s placeholders.

-- name: enqueue_jobs :many
-- Insert jobs (kind defaults fill priority and max_attempts), audit them, and unless
-- %(notify)s is false wake workers at commit (one NOTIFY per kind and transaction).
WITH input AS (
    -- %(jobs)s: one JSON array of {tenant_id, job_kind, payload, priority, available_at,
    -- idempotency_key, max_attempts} (one parameter is cheaper to send than seven arrays)
    SELECT j.*, e.ord
      FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS e(job, ord),
           jsonb_to_record(e.job) AS j(tenant_id uuid, job_kind text, payload jsonb,
                                       priority smallint, available_at timestamptz,
                                       idempotency_key text, max_attempts int)
), inserted AS (
    INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at,
                            idempotency_key, max_attempts)
    SELECT i.tenant_id, i.job_kind, i.payload, coalesce(i.priority, k.priority, 100),
           coalesce(i.available_at, now()), i.idempotency_key,
           coalesce(i.max_attempts, k.max_attempts, 1)
      FROM input i LEFT JOIN mdm.aa_job_kind k ON k.name = i.job_kind
     ORDER BY i.ord
    ON CONFLICT (tenant_id, job_kind, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING id, tenant_id, job_kind, idempotency_key
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT coalesce(%(actor)s, current_user), tenant_id, id, 'job_enqueued',
           jsonb_build_object('kind', job_kind)
      FROM inserted
), notified AS (
    SELECT pg_notify('jobpool', job_kind) FROM (SELECT DISTINCT job_kind FROM inserted) AS d
     WHERE %(notify)s::bool
)
SELECT id, tenant_id, job_kind, idempotency_key, (SELECT count(*) FROM notified) AS notified
  FROM inserted
 ORDER BY id;

-- name: find_idempotent_jobs :many
-- The existing jobs that hold the given (tenant, kind, idempotency key) triples.
SELECT j.id, j.tenant_id, j.job_kind, j.idempotency_key
  FROM mdm.aa_job j
  JOIN unnest(%(tenant_ids)s::uuid[], %(kinds)s::text[], %(idempotency_keys)s::text[])
       AS k(tenant_id, job_kind, idempotency_key)
    ON (j.tenant_id, j.job_kind, j.idempotency_key) = (k.tenant_id, k.job_kind, k.idempotency_key);
