-- jobpool: no-transaction
-- Claims and lane counts walk the queue by lane, (kind, tenant) first, so a worker reads only
-- rows it could take, whatever the backlog of other kinds, tenants or throttled pairs; the
-- queue gauges are computed by one process per interval and served from a snapshot row;
-- tenants take turns at the claim.
-- Built CONCURRENTLY so that a big queue keeps working during the upgrade: this file runs
-- statement by statement outside a transaction, and a build interrupted half way (an
-- invalid index) is dropped and redone when the migration runs again.
DROP INDEX CONCURRENTLY IF EXISTS mdm.ix_aa_job_lane;
CREATE INDEX CONCURRENTLY ix_aa_job_lane
    ON mdm.aa_job (job_kind, tenant_id, priority, available_at, id) WHERE status = 'pending';
-- The claim no longer walks the whole queue in (priority, available_at) order.
DROP INDEX CONCURRENTLY IF EXISTS mdm.ix_aa_job_claim;
-- When each tenant last had a job claimed: tenants with ready work take turns, the one served
-- longest ago first (round robin within a priority level).
CREATE TABLE IF NOT EXISTS mdm.aa_tenant_turn (
    tenant_id uuid PRIMARY KEY REFERENCES mdm.aa_tenant (id) ON DELETE CASCADE,
    turn_at   timestamptz NOT NULL
);
-- The queue gauges, computed by one process per interval for every worker to serve.
CREATE TABLE IF NOT EXISTS mdm.aa_queue_gauges (
    singleton bool PRIMARY KEY DEFAULT true CHECK (singleton),
    taken_at  timestamptz NOT NULL DEFAULT 'epoch',
    gauges    jsonb NOT NULL DEFAULT '[]'::jsonb
);
INSERT INTO mdm.aa_queue_gauges DEFAULT VALUES ON CONFLICT DO NOTHING;
