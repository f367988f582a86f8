-- Paused work (mdm.aa_pause): pause, resume, list. A scope is a (tenant, kind) pair, a kind
-- (tenant NULL: every tenant) or a tenant (kind NULL: every kind).

-- name: pause_scope :one
-- Pause a scope (%(tenant_id)s and/or %(kind)s, NULL: every) and audit it, unless it is paused already (then no row).
-- The audit row carries the pause's tenant (NULL for a kind-wide pause), the kind, the
-- reason and the actor's tenant scope.
WITH paused AS (
    INSERT INTO mdm.aa_pause (tenant_id, job_kind, paused_by, reason)
    VALUES (%(tenant_id)s::uuid, %(kind)s::text, %(actor)s, %(reason)s::text)
    ON CONFLICT ((coalesce(tenant_id::text, '')), (coalesce(job_kind, ''))) DO NOTHING
    RETURNING tenant_id, job_kind, paused_by, paused_at, reason
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, action, payload)
    SELECT %(actor)s, tenant_id, 'work_paused',
           jsonb_build_object('kind', job_kind, 'reason', reason,
                              'tenant_scope', %(scope)s::jsonb)
      FROM paused
)
SELECT tenant_id, job_kind AS kind, paused_by, paused_at, reason FROM paused;

-- name: resume_scope :one
-- Resume a paused scope (as pause_scope names it) and audit it with how long it was paused; no row when it was not paused.
-- The workers serving its kinds are woken at commit, as an enqueue wakes them.
WITH resumed AS (
    DELETE FROM mdm.aa_pause
     WHERE coalesce(tenant_id::text, '') = coalesce(%(tenant_id)s::uuid::text, '')
       AND coalesce(job_kind, '') = coalesce(%(kind)s::text, '')
    RETURNING tenant_id, job_kind, paused_by, paused_at, reason
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, action, payload)
    SELECT %(actor)s, tenant_id, 'work_resumed',
           jsonb_build_object('kind', job_kind, 'paused_by', paused_by,
                              'paused_seconds', extract(epoch FROM now() - paused_at)::float8,
                              'tenant_scope', %(scope)s::jsonb)
      FROM resumed
), notified AS (
    SELECT pg_notify('jobpool', k.name)
      FROM mdm.aa_job_kind k, resumed r
     WHERE r.job_kind IS NULL OR k.name = r.job_kind
)
SELECT tenant_id, job_kind AS kind, paused_by, paused_at, reason,
       (SELECT count(*) FROM notified) AS woken_kinds
  FROM resumed;

-- name: get_pause :one
-- The pause of one scope (as pause_scope names it), if paused.
SELECT p.tenant_id, t.key AS tenant, p.job_kind AS kind, p.paused_by, p.paused_at, p.reason
  FROM mdm.aa_pause p LEFT JOIN mdm.aa_tenant t ON t.id = p.tenant_id
 WHERE coalesce(p.tenant_id::text, '') = coalesce(%(tenant_id)s::uuid::text, '')
   AND coalesce(p.job_kind, '') = coalesce(%(kind)s::text, '');

-- name: list_pauses :many
-- The paused scopes that the tenants with the given keys (NULL: every tenant) are under: their own and every kind-wide one, oldest first.
SELECT p.tenant_id, t.key AS tenant, p.job_kind AS kind, p.paused_by, p.paused_at, p.reason
  FROM mdm.aa_pause p LEFT JOIN mdm.aa_tenant t ON t.id = p.tenant_id
 WHERE %(tenants)s::text[] IS NULL OR p.tenant_id IS NULL OR t.key = ANY(%(tenants)s::text[])
 ORDER BY p.paused_at, t.key NULLS FIRST, p.job_kind NULLS FIRST;

-- name: kind_exists :one
-- Whether a kind is registered.
SELECT EXISTS (SELECT 1 FROM mdm.aa_job_kind WHERE name = %(kind)s) AS registered;
