-- Enqueueing jobs. Parameters are psycopg's placeholders: %(name)s sent as text, %(name)b in
-- binary (arrays of numbers, times and text, which need no parsing on the server).
-- The jobs come as columns, one element per job in batch order: %(payloads)s one JSON array
-- text, %(tenant_ids)s and %(kinds)s comma-separated text (a uuid or a kind name holds no
-- comma; one join on the client, one split here, whatever the batch's size), the others
-- arrays. An array that is NULL stands for one that holds only NULLs (ROWS FROM pads the
-- shorter ones with NULLs), so the common batch sends none of them. %(trace_context)s is the
-- enqueuer's trace context (a JSON object, the same for every job of the call) or NULL.

-- name: enqueue_unkeyed_jobs :one
-- Insert jobs that have no idempotency key (kind defaults fill priority and max_attempts),
-- audit them, and unless %(notify)s is false wake workers at commit (one NOTIFY per kind and
-- transaction); the ids of the jobs, in batch order. A plain INSERT: without a key no row can
-- conflict, and ON CONFLICT would make every row a speculative insertion.
WITH input AS (
    SELECT i.*
      FROM ROWS FROM (jsonb_array_elements(%(payloads)s::jsonb),
                      unnest(string_to_array(%(tenant_ids)s, ',')::uuid[]),
                      unnest(string_to_array(%(kinds)s, ',')),
                      unnest(%(priorities)b::smallint[]),
                      unnest(%(available_at)b::timestamptz[]),
                      unnest(%(max_attempts)b::int[]))
           WITH ORDINALITY AS i(payload, tenant_id, job_kind, priority, available_at,
                                max_attempts, ord)
), inserted AS (
    INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at, max_attempts,
                            trace_context)
    SELECT i.tenant_id, i.job_kind, i.payload, coalesce(i.priority, k.priority, 100),
           coalesce(i.available_at, now()), coalesce(i.max_attempts, k.max_attempts, 1),
           %(trace_context)s::jsonb
      FROM input i LEFT JOIN mdm.aa_job_kind k ON k.name = i.job_kind
     ORDER BY i.ord
    RETURNING id, tenant_id, job_kind
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT coalesce(%(actor)s, current_user), tenant_id, id, 'job_enqueued',
           jsonb_build_object('kind', job_kind)
      FROM inserted
), notified AS (
    SELECT pg_notify('jobpool', job_kind) FROM (SELECT DISTINCT job_kind FROM inserted) AS d
     WHERE %(notify)s::bool
)
SELECT array_agg(id) AS ids, (SELECT count(*) FROM notified) AS notified
  FROM inserted;

-- name: enqueue_jobs :many
-- Insert jobs of which some have an idempotency key, skipping those whose key exists for
-- their (tenant, kind); audit and notify as enqueue_unkeyed_jobs. The rows inserted.
WITH input AS (
    SELECT i.*
      FROM ROWS FROM (jsonb_array_elements(%(payloads)s::jsonb),
                      unnest(string_to_array(%(tenant_ids)s, ',')::uuid[]),
                      unnest(string_to_array(%(kinds)s, ',')),
                      unnest(%(priorities)b::smallint[]),
                      unnest(%(available_at)b::timestamptz[]),
                      unnest(%(max_attempts)b::int[]), unnest(%(idempotency_keys)b::text[]))
           WITH ORDINALITY AS i(payload, tenant_id, job_kind, priority, available_at,
                                max_attempts, idempotency_key, ord)
), inserted AS (
    INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at, max_attempts,
                            idempotency_key, trace_context)
    SELECT i.tenant_id, i.job_kind, i.payload, coalesce(i.priority, k.priority, 100),
           coalesce(i.available_at, now()), coalesce(i.max_attempts, k.max_attempts, 1),
           i.idempotency_key, %(trace_context)s::jsonb
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
SELECT id, tenant_id::text AS tenant_id, job_kind, idempotency_key,
       (SELECT count(*) FROM notified) AS notified
  FROM inserted
 ORDER BY id;

-- name: find_idempotent_jobs :many
-- The existing jobs that hold the given (tenant, kind, idempotency key) triples.
SELECT j.id, j.tenant_id::text AS tenant_id, j.job_kind, j.idempotency_key
  FROM mdm.aa_job j
  JOIN unnest(%(tenant_ids)s::uuid[], %(kinds)s::text[], %(idempotency_keys)s::text[])
       AS k(tenant_id, job_kind, idempotency_key)
    ON (j.tenant_id, j.job_kind, j.idempotency_key) = (k.tenant_id, k.job_kind, k.idempotency_key);
