-- One token bucket per rate limit for the whole pool: a tenant's limit for a kind
-- ('tenant/<tenant uuid>/<kind>') or a provider's cap ('provider/<name>'). The balance is
-- refilled from the time elapsed when a worker leases tokens (lease_tokens), so nothing
-- writes to a bucket nobody uses. It goes below zero while leased tokens are owed: a worker
-- that leased them waits until the refill covers them.
CREATE TABLE mdm.aa_rate_bucket (
    key        text PRIMARY KEY,
    rps        double precision NOT NULL CHECK (rps > 0),
    burst      integer NOT NULL CHECK (burst >= 1),
    tokens     double precision NOT NULL,
    taken      integer NOT NULL CHECK (taken >= 1),
    updated_at timestamptz NOT NULL
);
-- Every lease updates its row: keep the update HOT and the dead tuples few.
ALTER TABLE mdm.aa_rate_bucket SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000
);
