-- Live workers: every worker process registers a row here and renews its heartbeat every few
-- seconds (one small UPDATE, never one per job); a cleanly exiting worker deletes its row.
-- Readers ignore rows whose heartbeat is older than the bound `jobpool.db.live_workers`
-- names, and whoever notices them deletes them (a worker that starts, or one a minute).
CREATE TABLE IF NOT EXISTS mdm.aa_worker (
    worker_id              text PRIMARY KEY,           -- claimed_by of the jobs it runs
    host                   text NOT NULL,
    pid                    integer NOT NULL,
    pool                   text,                       -- JOBPOOL_POOL, set for a pool's lanes
    lane                   text,                       -- JOBPOOL_LANE
    kinds                  text[] NOT NULL,
    tenants                text[] NOT NULL,            -- keys or ids as configured; {}: all
    slots                  integer NOT NULL CHECK (slots > 0),
    busy_slots             integer NOT NULL DEFAULT 0 CHECK (busy_slots >= 0),
    started_at             timestamptz NOT NULL DEFAULT now(),
    heartbeat_at           timestamptz NOT NULL DEFAULT now(),
    last_claim_at          timestamptz,
    claims_last_minute     integer NOT NULL DEFAULT 0 CHECK (claims_last_minute >= 0),
    completions_last_minute integer NOT NULL DEFAULT 0 CHECK (completions_last_minute >= 0)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
