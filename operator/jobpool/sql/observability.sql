-- Named queries of metrics.

-- name: gauge_transaction_settings :one
-- The gauge transaction's own settings (SET LOCAL, which a transaction pooler passes, unlike
-- startup options): the grouped count stops after 10 s, and JIT compiling it would cost more
-- than the count itself.
SELECT set_config('statement_timeout', '10000', true) AS statement_timeout,
       set_config('jit', 'off', true) AS jit;

-- name: queue_gauge_snapshot :one
-- The queue gauges of the whole pool: recomputed by the first process that finds the snapshot older than %(max_age)s seconds, read by every other.
-- Election: that process locks the snapshot row (the others skip the locked row and serve
-- the previous snapshot), so the grouped count over the queue runs once per interval for the
-- whole pool, whatever the number of workers. gauges: one JSON array of {tenant, kind,
-- pending, ready, running, dlq, ready_age, paused (pending jobs a pause holds)}; age: seconds
-- since it was taken; computed: whether this call took it.
WITH elected AS (
    SELECT singleton
      FROM mdm.aa_queue_gauges
     WHERE taken_at < now() - make_interval(secs => %(max_age)s::float8)
       FOR UPDATE SKIP LOCKED
), fresh AS (
    UPDATE mdm.aa_queue_gauges AS g
       SET taken_at = now(),
           gauges = (
               SELECT coalesce(jsonb_agg(to_jsonb(c) ORDER BY c.tenant, c.kind), '[]'::jsonb)
                 FROM (SELECT t.key AS tenant, j.job_kind AS kind,
                              count(*) FILTER (WHERE j.status = 'pending') AS pending,
                              count(*) FILTER (WHERE j.status = 'pending'
                                                 AND j.available_at <= now()) AS ready,
                              count(*) FILTER (WHERE j.status = 'running') AS running,
                              count(*) FILTER (WHERE j.status = 'dlq') AS dlq,
                              coalesce(extract(epoch FROM now() - min(j.available_at)
                                       FILTER (WHERE j.status = 'pending'
                                                 AND j.available_at <= now())),
                                       0)::float8 AS ready_age,
                              CASE WHEN EXISTS (
                                        SELECT 1 FROM mdm.aa_pause p
                                         WHERE (p.tenant_id = j.tenant_id OR p.tenant_id IS NULL)
                                           AND (p.job_kind = j.job_kind OR p.job_kind IS NULL))
                                   THEN count(*) FILTER (WHERE j.status = 'pending')
                                   ELSE 0 END AS paused
                         FROM mdm.aa_job j
                         JOIN mdm.aa_tenant t ON t.id = j.tenant_id
                        WHERE j.status IN ('pending', 'running', 'dlq')
                        GROUP BY t.key, j.tenant_id, j.job_kind) AS c)
      FROM elected
     WHERE g.singleton = elected.singleton
    RETURNING g.taken_at, g.gauges
)
SELECT gauges, extract(epoch FROM now() - taken_at)::float8 AS age, true AS computed
  FROM fresh
UNION ALL
SELECT gauges, extract(epoch FROM now() - taken_at)::float8 AS age, false AS computed
  FROM mdm.aa_queue_gauges
 WHERE NOT EXISTS (SELECT 1 FROM fresh);
