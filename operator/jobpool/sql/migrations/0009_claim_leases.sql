-- A claim's lease: until when the claim holds without another renewal. The claiming worker
-- sets it and renews it (a thread of its own, whatever its handlers do to its event loop);
-- recovery takes back claims whose lease lapsed, whatever the kind's stale TTL. A claim
-- without a lease of its own (made before this column existed) keeps the earlier rule: it
-- lapses a stale TTL after its last heartbeat.
-- Adding a column without a default rewrites nothing: a brief lock, no scan.
ALTER TABLE mdm.aa_job ADD COLUMN IF NOT EXISTS lease_expires_at timestamptz;
COMMENT ON COLUMN mdm.aa_job.lease_expires_at IS
    'Until when the running claim holds without a renewal; it counts only when not before '
    'claimed_at (else the claim lapses a stale TTL after its last heartbeat).';
-- When each maintenance task (retention, compaction) last ran: workers take turns without a
-- leader, the first to find the period over runs it.
CREATE TABLE IF NOT EXISTS mdm.aa_maintenance_run (
    task   text PRIMARY KEY,
    ran_at timestamptz NOT NULL
);
