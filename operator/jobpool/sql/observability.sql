-- Named queries of metrics.

-- name: queue_gauges :many
-- Pending, ready, running and DLQ jobs per tenant key and kind, and the oldest ready job's age.
SELECT t.key AS tenant, j.job_kind AS kind,
       count(*) FILTER (WHERE j.status = 'pending')::bigint AS pending,
       count(*) FILTER (WHERE j.status = 'pending' AND j.available_at <= now())::bigint AS ready,
       count(*) FILTER (WHERE j.status = 'running')::bigint AS running,
       count(*) FILTER (WHERE j.status = 'dlq')::bigint AS dlq,
       coalesce(extract(epoch FROM now() - min(j.available_at)
                        FILTER (WHERE j.status = 'pending' AND j.available_at <= now())),
                0)::float8 AS ready_age
  FROM mdm.aa_job j
  JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE j.status IN ('pending', 'running', 'dlq')
 GROUP BY t.key, j.job_kind
 ORDER BY t.key, j.job_kind;
