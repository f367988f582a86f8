-- A claimed job's outcome: done, retry, DLQ, or back to pending (rate limit). Each is a
-- compare-and-set on (status, claimed_by, attempts).

-- name: complete_job :one
-- Mark a job done (with the handler's result) if this worker still holds its claim
-- (`mdm.aa_job_done`, which also writes the audit row).
SELECT mdm.aa_job_done(%(id)s, %(attempts)s, %(worker_id)s, %(actor)s, %(result)s::jsonb,
                       false) AS changed;

-- name: complete_job_or_raise :exec
-- The same, in the query that ends a writing job with its session reset and COMMIT, after
-- its deferred constraints were checked (`mdm.aa_job_end`, which also readies the
-- transaction for the reset): a claim no longer held raises SQLSTATE JP001, so that the
-- COMMIT after it does not run.
-- str.format(): every placeholder a literal (`QueueStore.done_statement`).
SELECT mdm.aa_job_end({id}, {attempts}, {worker_id}, {actor}, {result}::jsonb);

-- name: complete_jobs :many
-- Mark done, in one statement, jobs whose handlers wrote nothing; each only if still claimed:
-- (id, true) for each job marked done, (id, false) for a job still claimed by this worker
-- whose row another session holds locked (a handler's own transaction on it, an admin's):
-- passed over rather than waited for, since the claim in the same transaction must not wait
-- on another session, and written with a later batch. A job in neither lost its claim.
-- %(results)s null: no job returned a result (unnest pads a missing array with nulls).
WITH input AS (
    SELECT *
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::jsonb[])
           AS i(id, attempts, result)
), locked AS (
    -- rows are locked in id order, and rows locked elsewhere are passed over, as the lease
    -- renewal passes over them; each by
    -- one descent of ix_aa_job_running (the lateral subquery, kept apart by OFFSET 0): a join
    -- may be planned as a rescan of the batch per running job (quadratic in the batch)
    SELECT j.id, i.result
      FROM (SELECT * FROM input ORDER BY id) i
      CROSS JOIN LATERAL (
            SELECT j.id FROM mdm.aa_job j
             WHERE j.id = i.id AND j.status = 'running' AND j.claimed_by = %(worker_id)s
               AND j.attempts = i.attempts
             OFFSET 0
               FOR NO KEY UPDATE SKIP LOCKED) j
), held AS (
    -- as arrays read once: a join of the update to the locked rows is planned as a rescan
    -- of them per row (quadratic in the batch)
    SELECT array_agg(id) AS ids, array_agg(result) AS results FROM locked
), done AS (
    -- by primary key alone: `locked` holds these rows, checked there. A condition on
    -- claimed_by here is planned as a walk of every entry of this worker's in
    -- ix_aa_job_running, which a snapshot held open keeps for each job it claimed since
    UPDATE mdm.aa_job j
       SET status = 'done', completed_at = clock_timestamp(), last_error = NULL,
           heartbeat_at = NULL, lease_expires_at = NULL,
           result = (SELECT results FROM held)[array_position((SELECT ids FROM held), j.id)]
     WHERE j.id = ANY ((SELECT ids FROM held)::bigint[])
    RETURNING j.id, j.tenant_id, j.job_kind
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_done', jsonb_build_object('kind', job_kind) FROM done
), busy AS (
    -- looked for only when a row was passed over (the one-time filter first): the jobs
    -- still claimed by this worker among the rows not locked here, read unlocked
    SELECT i.id
      FROM input i
     WHERE (SELECT count(*) FROM locked) < (SELECT count(*) FROM input)
       AND NOT EXISTS (SELECT 1 FROM locked l WHERE l.id = i.id)
       AND EXISTS (SELECT 1 FROM mdm.aa_job j
                    WHERE j.id = i.id AND j.status = 'running'
                      AND j.claimed_by = %(worker_id)s AND j.attempts = i.attempts)
)
SELECT id, true AS done FROM done
UNION ALL
SELECT id, false FROM busy;

-- name: completed_before :many
-- Of `done`s whose commit a failure hid (a connection lost with the COMMIT's answer),
-- those that did commit (run only then: every batch would pay for the look-up).
-- One primary-key probe per id (the lateral subquery, kept apart by OFFSET 0, names the id
-- alone, so no other index fits it): a join could be planned as a scan of every done job,
-- each compared with every id.
SELECT j.id
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts)
 CROSS JOIN LATERAL (
       SELECT j.id, j.status, j.claimed_by, j.attempts FROM mdm.aa_job j WHERE j.id = i.id
       OFFSET 0) j
 WHERE j.status = 'done' AND j.claimed_by = %(worker_id)s AND j.attempts = i.attempts;

-- name: retry_job :one
-- Back to pending after a transient failure, audited with its error (the job row keeps only
-- the last); the delay counts from now, not the transaction start.
WITH retried AS (
    UPDATE mdm.aa_job
       SET status = 'pending',
           available_at = clock_timestamp() + make_interval(secs => %(delay)s),
           last_error = %(error)s, claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL,
           lease_expires_at = NULL
     WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
       AND attempts = %(attempts)s
    RETURNING id, tenant_id, job_kind, attempts
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_retry',
           jsonb_build_object('kind', job_kind, 'error', %(error)s::text, 'attempt', attempts,
                              'delay_seconds', %(delay)s::float8)
      FROM retried
)
SELECT id FROM retried;

-- name: dead_letter_job :one
-- Park a job in the DLQ and audit it with its last error.
WITH parked AS (
    UPDATE mdm.aa_job
       SET status = 'dlq', completed_at = clock_timestamp(), last_error = %(error)s,
           heartbeat_at = NULL, lease_expires_at = NULL
     WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
       AND attempts = %(attempts)s
    RETURNING id, tenant_id, job_kind, attempts
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_dlq',
           jsonb_build_object('kind', job_kind, 'last_error', %(error)s::text,
                              'attempts', attempts)
      FROM parked
)
SELECT id FROM parked;

-- name: release_job :one
-- Hand a claimed job back without using up its attempt: after a delay (rate limit), or at
-- once (shutdown), then keeping its place in the queue.
UPDATE mdm.aa_job
   SET status = 'pending', attempts = attempts - 1,
       available_at = CASE WHEN %(delay)s::float8 > 0
                           THEN clock_timestamp() + make_interval(secs => %(delay)s::float8)
                           ELSE available_at END,
       claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL,
       lease_expires_at = NULL
 WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
   AND attempts = %(attempts)s
RETURNING id;
