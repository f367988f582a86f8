-- Queue maintenance (worker/maintenance.py): stale-claim recovery, done-job retention and
-- the schedule of the cleanup_jobs job. Parameters are psycopg's %(name)s placeholders.

-- name: recover_stale_claims :many
-- Take back claims whose lease expired, keeping each job's place in the queue (its
-- available_at); a job out of attempts goes to the DLQ instead.
WITH stale AS (
    SELECT j.id
      FROM mdm.aa_job j
      JOIN mdm.aa_job_kind k ON k.name = j.job_kind
     WHERE j.status = 'running'
       AND greatest(j.claimed_at, j.heartbeat_at) < clock_timestamp() - k.stale_ttl
       FOR UPDATE OF j SKIP LOCKED
), recovered AS (
    UPDATE mdm.aa_job j
       SET status = CASE WHEN j.attempts >= j.max_attempts
                         THEN 'dlq'::mdm.job_status ELSE 'pending'::mdm.job_status END,
           completed_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,
           last_error = left(coalesce(j.last_error, ''), 4000) || ' [stale-claim recovered]',
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL
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

-- name: schedule_cleanup :one
-- Enqueue the cleanup job of the current 5-minute slot once, however many workers ask.
WITH slot AS (
    SELECT to_timestamp(floor(extract(epoch FROM now()) / %(every)s) * %(every)s) AS starts
), inserted AS (
    INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at,
                            idempotency_key, max_attempts)
    SELECT '00000000-0000-0000-0000-000000000000', 'cleanup_jobs', '{}'::jsonb,
           k.priority, slot.starts,
           'cleanup_jobs@' || to_char(slot.starts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           k.max_attempts
      FROM slot JOIN mdm.aa_job_kind k ON k.name = 'cleanup_jobs'
    ON CONFLICT (tenant_id, job_kind, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING id
)
SELECT (SELECT id FROM inserted) AS id, (SELECT pg_notify('jobpool', 'cleanup_jobs')
                                          FROM inserted) IS NOT NULL AS notified;
