-- jobpool: no-transaction
-- The five checks on job times as range containment, where they called
-- mdm.jobpool_time_in_range: the same rule (NULL, or from 0001-01-02 up to, not including,
-- 9999-12-31 UTC), at a fraction of the cost. PostgreSQL prepares a table's CHECK expressions
-- anew for every statement that writes to it, and a call of a SQL function is inlined by
-- parsing the function's body each time: five such calls cost every single-row INSERT or
-- UPDATE of a job (an enqueue, a writing job's `done`, a retry) about 30 µs of server CPU,
-- the range tests a few.
-- Each check is replaced under its own name NOT VALID (a brief lock, no scan), then
-- validated, which scans without blocking writers. Every step is safe to run again after an
-- interruption.
ALTER TABLE mdm.aa_job
    DROP CONSTRAINT IF EXISTS aa_job_available_at_in_range,
    ADD CONSTRAINT aa_job_available_at_in_range
        CHECK (available_at <@ '[0001-01-02 00:00:00+00,9999-12-31 00:00:00+00)'::tstzrange) NOT VALID,
    DROP CONSTRAINT IF EXISTS aa_job_created_at_in_range,
    ADD CONSTRAINT aa_job_created_at_in_range
        CHECK (created_at <@ '[0001-01-02 00:00:00+00,9999-12-31 00:00:00+00)'::tstzrange) NOT VALID,
    DROP CONSTRAINT IF EXISTS aa_job_claimed_at_in_range,
    ADD CONSTRAINT aa_job_claimed_at_in_range
        CHECK (claimed_at <@ '[0001-01-02 00:00:00+00,9999-12-31 00:00:00+00)'::tstzrange) NOT VALID,
    DROP CONSTRAINT IF EXISTS aa_job_heartbeat_at_in_range,
    ADD CONSTRAINT aa_job_heartbeat_at_in_range
        CHECK (heartbeat_at <@ '[0001-01-02 00:00:00+00,9999-12-31 00:00:00+00)'::tstzrange) NOT VALID,
    DROP CONSTRAINT IF EXISTS aa_job_completed_at_in_range,
    ADD CONSTRAINT aa_job_completed_at_in_range
        CHECK (completed_at <@ '[0001-01-02 00:00:00+00,9999-12-31 00:00:00+00)'::tstzrange) NOT VALID;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_available_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_created_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_claimed_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_heartbeat_at_in_range;
ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT aa_job_completed_at_in_range;
