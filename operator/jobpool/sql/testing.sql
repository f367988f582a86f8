-- Named queries of jobpool.testing: run one given job inline through the worker's claim, list
-- jobs for assertions.

-- name: make_job_due :one
-- Make pending job %(id)s due now if it is due later; returns when it was due and when it is due now (no row: it is due already or not pending).
-- The worker's claim (claim_jobs) takes only due jobs: so it can run the job at once.
UPDATE mdm.aa_job j
   SET available_at = now()
  FROM mdm.aa_job was
 WHERE j.id = %(id)s AND was.id = j.id AND j.status = 'pending' AND j.available_at > now()
RETURNING was.available_at AS due_at, j.available_at AS made_due_at;

-- name: restore_due_time :exec
-- Give job %(id)s back the due time %(due_at)s that make_job_due moved to %(made_due_at)s, if it is still pending and unclaimed since.
UPDATE mdm.aa_job
   SET available_at = %(due_at)s
 WHERE id = %(id)s AND status = 'pending' AND available_at = %(made_due_at)s;

-- name: hold_kind :exec
-- Lock the kind row of job %(id)s for the caller's transaction, after every enqueue of that kind in progress committed: a job of the kind enqueued meanwhile waits (its foreign key check shares the row) until the transaction ends, so a claim in between cannot meet it.
SELECT k.name
  FROM mdm.aa_job j
  JOIN mdm.aa_job_kind k ON k.name = j.job_kind
 WHERE j.id = %(id)s
   FOR UPDATE OF k;

-- name: hold_pair_but :exec
-- Lock the pending jobs of job %(id)s's (tenant, kind) pair other than it, for the caller's transaction: a claim meanwhile skips them (SKIP LOCKED), so of that pair it can take job %(id)s alone.
SELECT o.id
  FROM mdm.aa_job j
  JOIN mdm.aa_job o ON o.tenant_id = j.tenant_id AND o.job_kind = j.job_kind
 WHERE j.id = %(id)s AND o.id <> j.id AND o.status = 'pending'
   FOR UPDATE OF o;

-- name: find_jobs :many
-- Jobs of one kind, tenant and status (each NULL: any), in the order they were enqueued.
SELECT j.*, j.status::text AS status
  FROM mdm.aa_job j
 WHERE (%(kind)s::text IS NULL OR j.job_kind = %(kind)s::text)
   AND (%(tenant_id)s::uuid IS NULL OR j.tenant_id = %(tenant_id)s::uuid)
   AND (%(status)s::text IS NULL OR j.status = %(status)s::text::mdm.job_status)
 ORDER BY j.id;
