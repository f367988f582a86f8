-- The registry of live workers (`mdm.aa_worker`, db/live_workers.py): each worker process
-- registers, renews its heartbeat every few seconds and deletes its row at a clean exit;
-- readers take only rows whose heartbeat is younger than %(dead_after)s seconds.

-- name: register_worker :exec
-- Register (or register again, after its row was deleted as dead during an outage) one worker process.
INSERT INTO mdm.aa_worker (worker_id, host, pid, pool, lane, kinds, tenants, slots, busy_slots,
                           last_claim_at, claims_last_minute, completions_last_minute)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(pool)s, %(lane)s, %(kinds)s::text[],
        %(tenants)s::text[], %(slots)s, %(busy_slots)s, %(last_claim_at)s,
        %(claims_last_minute)s, %(completions_last_minute)s)
ON CONFLICT (worker_id) DO UPDATE
   SET heartbeat_at = now(), busy_slots = excluded.busy_slots,
       last_claim_at = excluded.last_claim_at,
       claims_last_minute = excluded.claims_last_minute,
       completions_last_minute = excluded.completions_last_minute;

-- name: beat_worker :one
-- Renew one worker's heartbeat with its busy slots, last claim and last minute's counts; no row: it was deleted as dead.
UPDATE mdm.aa_worker
   SET heartbeat_at = now(), busy_slots = %(busy_slots)s, last_claim_at = %(last_claim_at)s,
       claims_last_minute = %(claims_last_minute)s,
       completions_last_minute = %(completions_last_minute)s
 WHERE worker_id = %(worker_id)s
RETURNING worker_id;

-- name: forget_worker :exec
-- Delete one worker's row (it exits cleanly).
DELETE FROM mdm.aa_worker WHERE worker_id = %(worker_id)s;

-- name: forget_dead_workers :many
-- Delete the rows of workers whose heartbeat is older than the bound; return their ids.
DELETE FROM mdm.aa_worker
 WHERE heartbeat_at < now() - make_interval(secs => %(dead_after)s)
RETURNING worker_id;

-- name: live_workers :many
-- The workers whose heartbeat is younger than the bound, by lane, host and pid.
SELECT worker_id, host, pid, pool, lane, kinds, tenants, slots, busy_slots, started_at,
       heartbeat_at, last_claim_at, claims_last_minute, completions_last_minute
  FROM mdm.aa_worker
 WHERE heartbeat_at >= now() - make_interval(secs => %(dead_after)s)
 ORDER BY lane NULLS LAST, host, pid, worker_id;

-- name: running_jobs :many
-- Running jobs of the tenants with the given keys (NULL: every tenant), longest-running first, at most the limit, each with its holder's lane and whether the holder is live.
SELECT j.id, t.key AS tenant, j.job_kind AS kind, j.claimed_by AS holder, j.claimed_at,
       greatest(extract(epoch FROM now() - j.claimed_at), 0)::float8 AS age_seconds,
       w.lane, w.worker_id IS NOT NULL AS holder_live
  FROM mdm.aa_job j
  JOIN mdm.aa_tenant t ON t.id = j.tenant_id
  LEFT JOIN mdm.aa_worker w
    ON w.worker_id = j.claimed_by
   AND w.heartbeat_at >= now() - make_interval(secs => %(dead_after)s)
 WHERE j.status = 'running'
   AND (%(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[]))
 ORDER BY j.claimed_at, j.id
 LIMIT %(limit)s;

-- name: live_worker_gauges :one
-- The live workers per pool and lane (workers, slots, busy slots) as one JSON array, and the running jobs whose holder no longer beats.
SELECT coalesce((SELECT jsonb_agg(to_jsonb(g) ORDER BY g.pool, g.lane)
                   FROM (SELECT coalesce(pool, '') AS pool, coalesce(lane, '') AS lane,
                                count(*) AS workers, sum(slots) AS slots,
                                sum(busy_slots) AS busy
                           FROM mdm.aa_worker
                          WHERE heartbeat_at >= now() - make_interval(secs => %(dead_after)s)
                          GROUP BY 1, 2) AS g), '[]'::jsonb) AS lanes,
       (SELECT count(*)
          FROM mdm.aa_job j
         WHERE j.status = 'running'
           AND NOT EXISTS (SELECT 1 FROM mdm.aa_worker w
                            WHERE w.worker_id = j.claimed_by
                              AND w.heartbeat_at >= now() - make_interval(
                                  secs => %(dead_after)s))) AS unheld;
