-- Values one row can hold that would stop every reader: timestamps Python cannot hold
-- ('infinity', '-infinity', year 10000 and later, before year 1) and tenant metadata so
-- large that parsing it (the rate limits every worker reads every few seconds) stalls them.
-- Added NOT VALID (a brief lock, no scan): new and updated rows are checked from now on;
-- the next migration deals with existing rows and validates without blocking writers.

CREATE FUNCTION mdm.jobpool_time_in_range(t timestamptz) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT t IS NULL OR (t >= '0001-01-02 00:00:00+00' AND t < '9999-12-31 00:00:00+00') $$;
COMMENT ON FUNCTION mdm.jobpool_time_in_range(timestamptz) IS
    'Whether t is NULL or a time every client can read: years 1 to 9999 with a day to spare '
    'for time zones (Python''s datetime holds no more).';

ALTER TABLE mdm.aa_job
    ADD CONSTRAINT aa_job_available_at_in_range
        CHECK (mdm.jobpool_time_in_range(available_at)) NOT VALID,
    ADD CONSTRAINT aa_job_created_at_in_range
        CHECK (mdm.jobpool_time_in_range(created_at)) NOT VALID,
    ADD CONSTRAINT aa_job_claimed_at_in_range
        CHECK (mdm.jobpool_time_in_range(claimed_at)) NOT VALID,
    ADD CONSTRAINT aa_job_heartbeat_at_in_range
        CHECK (mdm.jobpool_time_in_range(heartbeat_at)) NOT VALID,
    ADD CONSTRAINT aa_job_completed_at_in_range
        CHECK (mdm.jobpool_time_in_range(completed_at)) NOT VALID;

-- 64 KiB of JSON text: room for rate limits of a few thousand kinds.
ALTER TABLE mdm.aa_tenant
    ADD CONSTRAINT aa_tenant_metadata_size
        CHECK (octet_length(metadata::text) <= 65536) NOT VALID;
