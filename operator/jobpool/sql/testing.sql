-- Named queries of jobpool.testing: run one given job inline, list jobs for assertions.

-- name: claim_job :one
-- Claim job %(id)s as claim_jobs does, if pending, however far ahead its available_at is.
UPDATE mdm.aa_job j
   SET status = 'running', claimed_by = %(worker_id)s, claimed_at = now(),
       heartbeat_at = now(), attempts = j.attempts + 1
 WHERE j.id = %(id)s AND j.status = 'pending'
RETURNING j.id, j.tenant_id, j.job_kind, j.payload, j.status::text AS status, j.priority,
          j.available_at, j.created_at, j.claimed_by, j.claimed_at, j.attempts,
          j.max_attempts, j.last_error, j.idempotency_key,
          extract(epoch FROM j.claimed_at - j.created_at)::float8 AS claim_latency;

-- name: find_jobs :many
-- Jobs of one kind, tenant and status (each NULL: any), in the order they were enqueued.
SELECT j.*, j.status::text AS status
  FROM mdm.aa_job j
 WHERE (%(kind)s::text IS NULL OR j.job_kind = %(kind)s::text)
   AND (%(tenant_id)s::uuid IS NULL OR j.tenant_id = %(tenant_id)s::uuid)
   AND (%(status)s::text IS NULL OR j.status = %(status)s::text::mdm.job_status)
 ORDER BY j.id;
