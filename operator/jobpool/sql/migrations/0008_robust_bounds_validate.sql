-- Existing rows that the previous migration's checks refuse, then the checks validated
-- (VALIDATE CONSTRAINT scans without blocking reads or writes).

-- A job with an unreadable time goes to the DLQ, each such time set to now(), its
-- last_error naming the column and the value it had, so an admin can replay or discard it.
WITH bad AS (
    SELECT id, concat_ws('; ',
               CASE WHEN NOT mdm.jobpool_time_in_range(available_at)
                    THEN 'available_at was ' || available_at::text END,
               CASE WHEN NOT mdm.jobpool_time_in_range(created_at)
                    THEN 'created_at was ' || created_at::text END,
               CASE WHEN NOT mdm.jobpool_time_in_range(claimed_at)
                    THEN 'claimed_at was ' || claimed_at::text END,
               CASE WHEN NOT mdm.jobpool_time_in_range(heartbeat_at)
                    THEN 'heartbeat_at was ' || heartbeat_at::text END,
               CASE WHEN NOT mdm.jobpool_time_in_range(completed_at)
                    THEN 'completed_at was ' || completed_at::text END) AS what
      FROM mdm.aa_job
     WHERE NOT (mdm.jobpool_time_in_range(available_at) AND mdm.jobpool_time_in_range(created_at)
                AND mdm.jobpool_time_in_range(claimed_at)
                AND mdm.jobpool_time_in_range(heartbeat_at)
                AND mdm.jobpool_time_in_range(completed_at))
), parked AS (
    UPDATE mdm.aa_job j
       SET status = 'dlq',
           available_at = CASE WHEN mdm.jobpool_time_in_range(available_at)
                               THEN available_at ELSE now() END,
           created_at = CASE WHEN mdm.jobpool_time_in_range(created_at)
                             THEN created_at ELSE now() END,
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL,
           completed_at = now(),
           last_error = left('OutOfRangeTime: ' || bad.what
                             || ' (outside years 1 to 9999), set to the time of this move', 4000)
      FROM bad
     WHERE j.id = bad.id
    RETURNING j.id, j.tenant_id, j.job_kind, j.attempts, j.last_error
)
INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
SELECT 'jobpool migrate', tenant_id, id, 'job_dlq',
       jsonb_build_object('kind', job_kind, 'last_error', last_error, 'attempts', attempts)
  FROM parked;

ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_available_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_created_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_claimed_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_heartbeat_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_completed_at_in_range;

-- Oversized tenant metadata is kept here for an admin, and the tenant's emptied: no worker
-- could use it without stalling every tenant.
CREATE TABLE mdm.jobpool_oversized_metadata (
    tenant_id uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    metadata  jsonb NOT NULL,
    moved_at  timestamptz NOT NULL DEFAULT now()
);
WITH big AS (
    SELECT id, metadata FROM mdm.aa_tenant WHERE octet_length(metadata::text) > 65536
), kept AS (
    INSERT INTO mdm.jobpool_oversized_metadata (tenant_id, metadata)
    SELECT id, metadata FROM big
)
UPDATE mdm.aa_tenant t SET metadata = '{}'::jsonb FROM big WHERE t.id = big.id;

ALTER TABLE mdm.aa_tenant VALIDATE CONSTRAINT aa_tenant_metadata_size;
