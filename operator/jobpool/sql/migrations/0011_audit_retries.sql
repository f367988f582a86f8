-- Each failed attempt that is retried gets an audit row of its own (its error, its attempt,
-- the delay): a job's history then shows every attempt between job_enqueued and job_dlq, not
-- only the last error the job row keeps.
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'job_retry';
