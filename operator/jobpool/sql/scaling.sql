-- name: count_transaction :one
-- The operator's settings for one count transaction, as SET LOCAL: a statement timeout of
-- %(timeout_ms)s ms, and no JIT compilation (the planner cannot see each lane's LIMIT, so it
-- would compile for a second what runs in a millisecond). Not session settings: a pool's DSN
-- may lead to a pooler, which refuses them as startup options, or in transaction mode keeps
-- a session setting on whichever server connection ran it, under other clients.
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true) AS statement_timeout,
       set_config('jit', 'off', true) AS jit;

-- name: count_lane_jobs :many
-- Per lane: jobs runnable now and running, of the kinds and tenants it serves, each counted up to the lane's cap.
-- A lane's scaler cannot want more replicas than its maximum, so counting beyond `cap` jobs
-- (`lane_count_cap`: max replicas x workers per pod x target utilisation) changes nothing;
-- each count reads at most `cap` entries of ix_aa_job_lane (ready) or ix_aa_job_running,
-- whatever the backlog. The lane's kinds are the registered kinds it serves (every job's kind
-- is registered), so the walk goes by kind, then tenant, like the claim's.
-- Paused work is no demand: the ready count leaves out kinds paused for every tenant (not
-- walked at all) and the jobs of paused pairs and tenants (their index entries are read and
-- skipped, at most the paused backlog); running jobs are counted until they finish.
WITH lane AS (
    SELECT l.name,
           array(SELECT k.name FROM mdm.aa_job_kind AS k
                  WHERE (l.kinds IS NULL OR k.name = ANY (l.kinds))
                    AND NOT (k.name = ANY (coalesce(l.exclude_kinds, '{}')))
                    AND NOT EXISTS (SELECT 1 FROM mdm.aa_pause AS p
                                     WHERE p.tenant_id IS NULL AND p.job_kind = k.name))
               AS ready_kinds,
           array(SELECT k.name FROM mdm.aa_job_kind AS k
                  WHERE (l.kinds IS NULL OR k.name = ANY (l.kinds))
                    AND NOT (k.name = ANY (coalesce(l.exclude_kinds, '{}')))) AS kinds,
           CASE WHEN cardinality(coalesce(l.tenants, '{}')) > 0
                THEN array(SELECT t.id FROM mdm.aa_tenant AS t
                            WHERE t.key = ANY (l.tenants) OR t.id::text = ANY (l.tenants))
           END AS tenant_ids,
           greatest(l.cap, 1) AS cap
      FROM jsonb_to_recordset(%(lanes)s::jsonb)
           AS l(name text, kinds text[], exclude_kinds text[], tenants text[], cap bigint)
)
SELECT lane.name AS lane,
       CASE WHEN lane.tenant_ids IS NULL
            THEN (SELECT count(*) FROM (
                         SELECT 1 FROM mdm.aa_job AS j
                          WHERE j.status = 'pending' AND j.job_kind = ANY (lane.ready_kinds)
                            AND j.available_at <= now()
                            AND NOT EXISTS (SELECT 1 FROM mdm.aa_pause AS p
                                             WHERE p.tenant_id = j.tenant_id
                                               AND (p.job_kind = j.job_kind
                                                    OR p.job_kind IS NULL))
                          LIMIT lane.cap) AS ready)
            ELSE (SELECT count(*) FROM (
                         SELECT 1 FROM mdm.aa_job AS j
                          WHERE j.status = 'pending' AND j.job_kind = ANY (lane.ready_kinds)
                            AND j.tenant_id = ANY (lane.tenant_ids) AND j.available_at <= now()
                            AND NOT EXISTS (SELECT 1 FROM mdm.aa_pause AS p
                                             WHERE p.tenant_id = j.tenant_id
                                               AND (p.job_kind = j.job_kind
                                                    OR p.job_kind IS NULL))
                          LIMIT lane.cap) AS ready)
       END AS ready,
       (SELECT count(*) FROM (
               SELECT 1 FROM mdm.aa_job AS j
                WHERE j.status = 'running' AND j.job_kind = ANY (lane.kinds)
                  AND (lane.tenant_ids IS NULL OR j.tenant_id = ANY (lane.tenant_ids))
                LIMIT lane.cap) AS running) AS running,
       lane.cap
  FROM lane
 ORDER BY lane.name;
