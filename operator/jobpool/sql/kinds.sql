-- Job kinds: their registration and their list.

-- name: register_kinds :exec
-- Insert or update the defaults of the kinds a worker serves.
INSERT INTO mdm.aa_job_kind (name, priority, max_attempts, stale_ttl)
SELECT name, priority, max_attempts, make_interval(secs => stale_ttl)
  FROM unnest(%(names)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
              %(stale_ttls)s::float8[]) AS k(name, priority, max_attempts, stale_ttl)
ON CONFLICT (name) DO UPDATE
   SET priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
       stale_ttl = EXCLUDED.stale_ttl, registered_at = now()
 WHERE (aa_job_kind.priority, aa_job_kind.max_attempts, aa_job_kind.stale_ttl)
       IS DISTINCT FROM (EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.stale_ttl);

-- name: list_kinds :many
-- Every registered kind with its defaults.
SELECT name, priority, max_attempts, extract(epoch FROM stale_ttl)::float8 AS stale_ttl,
       registered_at
  FROM mdm.aa_job_kind ORDER BY name;
