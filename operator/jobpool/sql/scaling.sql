-- name: count_lane_jobs :many
-- Per lane: jobs runnable now (pending, available_at <= now()) and running, of the kinds and tenants it serves.
WITH lane AS (
    SELECT l.name,
           l.kinds,
           coalesce(l.exclude_kinds, '{}') AS exclude_kinds,
           coalesce(l.tenants, '{}') AS tenants
      FROM jsonb_to_recordset(%(lanes)s::jsonb)
           AS l(name text, kinds text[], exclude_kinds text[], tenants text[])
)
SELECT lane.name AS lane,
       count(j.id) FILTER (WHERE j.status = 'pending' AND j.available_at <= now()) AS ready,
       count(j.id) FILTER (WHERE j.status = 'running') AS running
  FROM lane
  LEFT JOIN mdm.aa_job AS j
         ON j.status IN ('pending', 'running')
        AND (lane.kinds IS NULL OR j.job_kind = ANY (lane.kinds))
        AND NOT (j.job_kind = ANY (lane.exclude_kinds))
        AND (cardinality(lane.tenants) = 0
             OR j.tenant_id IN (SELECT t.id
                                  FROM mdm.aa_tenant AS t
                                 WHERE t.key = ANY (lane.tenants)
                                    OR t.id::text = ANY (lane.tenants)))
 GROUP BY lane.name
 ORDER BY lane.name;
