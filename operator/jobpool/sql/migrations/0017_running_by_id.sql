-- jobpool: no-transaction
-- A worker's running jobs by id: the batched `done` locks each of its jobs with one descent of
-- (claimed_by, id), in whatever plan, instead of reading every running job of the worker once
-- per job in the batch (a cost quadratic in the batch).
-- Built CONCURRENTLY beside the old index, which is then dropped and its name taken over, so a
-- big queue keeps working during the upgrade; every step is safe to run again after an
-- interruption.
DROP INDEX CONCURRENTLY IF EXISTS mdm.ix_aa_job_running_by_id;
CREATE INDEX CONCURRENTLY ix_aa_job_running_by_id
    ON mdm.aa_job (claimed_by, id) WHERE status = 'running';
DROP INDEX CONCURRENTLY IF EXISTS mdm.ix_aa_job_running;
ALTER INDEX mdm.ix_aa_job_running_by_id RENAME TO ix_aa_job_running;
