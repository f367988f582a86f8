-- Queue maintenance (worker/maintenance.py, worker/leases.py): recovery of lapsed claims and
-- done-job retention. Parameters are psycopg's %(name)s placeholders.

-- name: recovery_turn :one
-- Whether this transaction is the one recovering claims now (workers try every few seconds;
-- one at a time does the work, the others skip without waiting).
SELECT pg_try_advisory_xact_lock(hashtextextended('jobpool.recover-claims', 0)) AS locked;

-- name: recover_stale_claims :many
-- Take back claims whose lease lapsed, keeping each job's place in the queue (its
-- available_at); a job out of attempts goes to the DLQ instead. A claim's lease is its
-- lease_expires_at when that belongs to the claim (not before claimed_at); a claim without one
-- lapses a stale TTL after its last heartbeat. Reads only running rows (ix_aa_job_running).
WITH stale AS (
    SELECT j.id
      FROM mdm.aa_job j
      JOIN mdm.aa_job_kind k ON k.name = j.job_kind
     WHERE j.status = 'running'
       AND CASE WHEN j.lease_expires_at >= j.claimed_at THEN j.lease_expires_at
                ELSE greatest(j.claimed_at, j.heartbeat_at) + k.stale_ttl
           END < clock_timestamp()
       FOR NO KEY UPDATE OF j SKIP LOCKED
), recovered AS (
    UPDATE mdm.aa_job j
       SET status = CASE WHEN j.attempts >= j.max_attempts
                         THEN 'dlq'::mdm.job_status ELSE 'pending'::mdm.job_status END,
           completed_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,
           -- the worker named: a job recovered from live workers again and again (a handler
           -- blocking its loop past the lease) reads apart from one whose workers died
           last_error = concat_ws(' ', nullif(left(j.last_error, 4000), ''),
                                  '[stale-claim recovered from ' || j.claimed_by || ']'),
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL
      FROM stale
     WHERE j.id = stale.id
    RETURNING j.id, j.tenant_id, j.job_kind, j.status::text AS status, j.attempts, j.last_error
), audited AS (
    -- a recovered attempt is one of the job's attempts, as a retried one is
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id,
           CASE WHEN status = 'dlq' THEN 'job_dlq' ELSE 'job_retry' END::mdm.audit_action,
           CASE WHEN status = 'dlq'
                THEN jsonb_build_object('kind', job_kind, 'last_error', last_error,
                                        'attempts', attempts)
                ELSE jsonb_build_object('kind', job_kind, 'error', 'stale claim recovered: '
                                        || 'the worker stopped renewing its lease',
                                        'attempt', attempts, 'delay_seconds', 0)
           END
      FROM recovered
), notified AS (
    -- wake idle workers at commit, as an enqueue does: the jobs are runnable now
    SELECT pg_notify('jobpool', job_kind)
      FROM (SELECT DISTINCT job_kind FROM recovered WHERE status = 'pending') AS d
)
SELECT id, job_kind, status, attempts
  FROM recovered, (SELECT count(*) FROM notified) AS n
 ORDER BY id;

-- name: delete_expired_done_jobs :one
-- Delete one batch of done jobs completed before the retention period.
WITH doomed AS (
    SELECT id
      FROM mdm.aa_job
     WHERE status = 'done' AND completed_at < now() - make_interval(secs => %(retention)s)
     ORDER BY completed_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM mdm.aa_job j USING doomed WHERE j.id = doomed.id RETURNING j.id
)
SELECT count(*)::int AS deleted FROM deleted;
