-- The claim and what a worker does with its claims: the transaction's settings, lease
-- renewal, hand-back. Every change to a running job is a compare-and-set on (status,
-- claimed_by, attempts).

-- name: claim_jobs :many
-- The single-statement claim of up to %(limit)s jobs (free slots), by lane, tenants taking turns,
-- each leased for %(lease)s seconds.
-- Reads only what this worker could take, through ix_aa_job_lane (kind, tenant, priority,
-- available_at, id): the head (first ready job) of each (kind, tenant) pair it serves, found
-- by a loose index scan per kind (one descent per pair) or per pair of its own tenants; minus
-- the rate-limited pairs without a token now (%(capped)s: 'tenant-uuid/kind', or '*/kind' for
-- every pair of a kind, each with %(caps)s: the most jobs of the pair the worker can start
-- now, 0 to leave it out) and the paused ones (mdm.aa_pause), whose backlog so costs one
-- descent and no lock. Rows of the first %(limit)s pairs by (head priority, the pair's rank in
-- its tenant, last turn) are locked with SKIP LOCKED, at most as many per pair as it could
-- win and no more than its cap: a job taken beyond it would go back to pending for want of a
-- token, in a transaction of its own. Of those, the claim takes
-- by priority, then by the row's rank among its tenant's rows of that priority, then by the
-- tenant's last turn (mdm.aa_tenant_turn, oldest first), then by available_at: within a
-- priority level tenants take turns (round robin), across levels priority rules.
-- A bounded claim (%(bounds)s, jsonb: [{job_kind, tenant_id, priority, available_at, id}])
-- reads only the pairs named, each past its position: while a snapshot held open keeps every
-- claimed job's index entry alive (docs/operations.md, "A snapshot held open").
WITH RECURSIVE
kinds AS (
    -- a kind paused for every tenant is not walked at all
    SELECT DISTINCT k.job_kind FROM unnest(%(kinds)s::text[]) AS k(job_kind)
     WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_pause p
                        WHERE p.tenant_id IS NULL AND p.job_kind = k.job_kind)
),
scanned AS (
    -- a full claim for every tenant (%(tenants)s null): the head of each pair, walking the
    -- tenants of a kind
    SELECT h.*
      FROM kinds k
      CROSS JOIN LATERAL (
           SELECT job_kind, tenant_id, priority, available_at, id FROM mdm.aa_job
            WHERE status = 'pending' AND job_kind = k.job_kind AND available_at <= now()
            ORDER BY tenant_id, priority, available_at, id
            LIMIT 1) h
     WHERE %(tenants)s::uuid[] IS NULL
    UNION ALL
    SELECT h.*
      FROM scanned s
      CROSS JOIN LATERAL (
           SELECT job_kind, tenant_id, priority, available_at, id FROM mdm.aa_job
            WHERE status = 'pending' AND job_kind = s.job_kind AND tenant_id > s.tenant_id
              AND available_at <= now()
            ORDER BY tenant_id, priority, available_at, id
            LIMIT 1) h
),
heads AS (
    SELECT * FROM scanned
    UNION ALL
    -- the pairs looked up one by one, the head of each past a position (priority,
    -- available_at, id): the pairs of the worker's own tenants (%(tenants)s, distinct; empty
    -- for a bounded claim), from the start; the pairs of a bounded claim (%(bounds)s,
    -- `jobpool.core.claim_bounds`), each past the last job this worker took there, so that
    -- it does not step over the jobs claimed before
    SELECT h.*
      FROM (SELECT k.job_kind, t, -32768, '-infinity'::timestamptz, 0
              FROM kinds k, unnest(%(tenants)s::uuid[]) t
            UNION ALL
            SELECT b.job_kind, b.tenant_id, b.priority, b.available_at, b.id
              FROM jsonb_populate_recordset(NULL::mdm.aa_job, %(bounds)s::jsonb) b
              JOIN kinds USING (job_kind)) b (job_kind, tenant_id, priority, available_at, id)
      CROSS JOIN LATERAL (
           SELECT job_kind, tenant_id, priority, available_at, id FROM mdm.aa_job
            WHERE status = 'pending' AND job_kind = b.job_kind AND tenant_id = b.tenant_id
              AND (priority, available_at, id) > (b.priority, b.available_at, b.id)
              AND available_at <= now()
            ORDER BY priority, available_at, id
            LIMIT 1) h
),
open_heads AS (
    -- heads of the pairs neither capped at 0 nor paused, with their tenant's last turn, rank
    -- in the tenant and cap: the smaller of the pair's and its kind's (NULL: unlimited)
    SELECT h.*, tt.turn_at, c.cap,
           row_number() OVER (PARTITION BY h.tenant_id
                              ORDER BY priority, available_at, id) AS rank
      FROM heads h
      LEFT JOIN mdm.aa_tenant_turn tt USING (tenant_id)
      CROSS JOIN LATERAL (
           SELECT min(c.cap) AS cap
             FROM unnest(%(capped)s::text[], %(caps)s::int[]) AS c(pair, cap)
            WHERE c.pair IN (h.tenant_id || '/' || job_kind, '*/' || job_kind)) c
     WHERE coalesce(c.cap, 1) > 0
       -- paused: the pair, or its tenant for every kind (ix_aa_pause_lookup)
       AND NOT EXISTS (SELECT 1 FROM mdm.aa_pause p
                        WHERE p.tenant_id = h.tenant_id
                          AND (p.job_kind = h.job_kind OR p.job_kind IS NULL))
),
chosen AS (
    SELECT *
      FROM open_heads
     ORDER BY priority, rank, turn_at NULLS FIRST, available_at, id
     LIMIT %(limit)s
),
locked AS (
    SELECT r.*, c.turn_at
      FROM chosen c
      CROSS JOIN LATERAL (
           SELECT id, tenant_id, priority, available_at FROM mdm.aa_job
            WHERE status = 'pending' AND job_kind = c.job_kind
              AND tenant_id = c.tenant_id AND available_at <= now()
              -- from the pair's head on: what lies before it in the index is not pending for
              -- this statement's snapshot, and may be many entries (a snapshot held open)
              AND (priority, available_at, id) >= (c.priority, c.available_at, c.id)
            ORDER BY priority, available_at, id
            -- least() passes over a NULL cap
            LIMIT least(%(limit)s - (SELECT count(*) FROM chosen) + 1, c.cap)
              FOR NO KEY UPDATE SKIP LOCKED) r
),
next AS (
    SELECT id, row_number() OVER (ORDER BY priority, turn, turn_at NULLS FIRST, available_at,
                                           id) AS ord
      FROM (SELECT *, row_number() OVER (PARTITION BY tenant_id, priority
                                         ORDER BY available_at, id) AS turn
              FROM locked) ranked
     ORDER BY ord
     LIMIT %(limit)s
),
claimed AS (
    -- by primary key: the plan is made once for any %(limit)s, and a join could scan the table
    UPDATE mdm.aa_job
       SET status = 'running', claimed_by = %(worker_id)s, claimed_at = now(),
           heartbeat_at = now(), lease_expires_at = now() + make_interval(secs => %(lease)s),
           attempts = attempts + 1
     WHERE id = ANY (ARRAY(SELECT id FROM next))
    RETURNING id, tenant_id, job_kind, payload, status, priority,
              available_at, created_at, claimed_by, claimed_at, attempts,
              max_attempts, last_error, idempotency_key, trace_context,
              -- the claim statement's time to the rows' writing (its walk of the index,
              -- without the batched `done` before it, the COMMIT or the network) and the
              -- heads found (`jobpool.core.claim_bounds`)
              date_part('epoch', clock_timestamp() - statement_timestamp()) took,
              (SELECT count(*) FROM heads) heads
),
served AS (
    SELECT DISTINCT tenant_id FROM claimed
),
turned AS (
    -- the served tenants go to the back of the line; a turn row another claim holds is
    -- skipped (that claim sets the same time), so claims never wait for each other here.
    -- A claim that served one tenant whose turn is already the newest of all leaves it:
    -- it stays last in line either way, and a one-tenant drain writes no turn per claim
    -- (ix_aa_tenant_turn_at: one descent).
    UPDATE mdm.aa_tenant_turn t
       SET turn_at = now()
      FROM (SELECT tt.tenant_id FROM mdm.aa_tenant_turn tt
             WHERE tt.tenant_id IN (SELECT tenant_id FROM served)
               AND ((SELECT count(*) FROM served) > 1
                    OR EXISTS (SELECT 1 FROM mdm.aa_tenant_turn o
                                WHERE o.turn_at >= tt.turn_at AND o.tenant_id <> tt.tenant_id))
             ORDER BY tt.tenant_id
               FOR UPDATE SKIP LOCKED) free
     WHERE t.tenant_id = free.tenant_id
),
first_turns AS (
    -- a tenant's first turn (a tenant with one already: the conflict, found before any row
    -- is written); in tenant order, so two claims meeting new tenants never deadlock
    INSERT INTO mdm.aa_tenant_turn (tenant_id, turn_at)
    SELECT tenant_id, now() FROM served ORDER BY tenant_id
    ON CONFLICT (tenant_id) DO NOTHING
)
SELECT claimed.* FROM claimed JOIN next USING (id) ORDER BY ord;

-- name: claim_session :one
-- Settings of the worker's claim connection (set once when it opens).
-- The claim's shape fixes its plan (index descents per pair, look-ups by key), so the generic
-- plan of the prepared statement serves every parameter: planning its CTEs on every call would
-- cost more than running them. It walks ix_aa_job_lane also before the table has statistics (a
-- freshly filled queue), and never pays JIT compilation for a statement of milliseconds. Its
-- commits keep the server's (the role's, the database's) `synchronous_commit`, as every other
-- connection of the worker does (docs/writing-kinds.md, "Durability"). Nothing else runs on
-- this connection: a handler's writes keep the server's planner settings. It waits idle
-- between claims when the queue is empty: no `idle_session_timeout` closes it then.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false) AS plan_cache_mode,
       set_config('enable_seqscan', 'off', false) AS seqscan,
       set_config('enable_bitmapscan', 'off', false) AS bitmapscan,
       set_config('jit', 'off', false) AS jit,
       set_config('idle_session_timeout', '0', false) AS idle_session_timeout;

-- name: lease_session :one
-- Settings of the worker's lease connection (autocommit; set once when it opens): a renewal
-- or recovery that waits for a lock longer than a renewal period (%(timeout_ms)s ms) gives up
-- and is tried again, rather than holding up the renewal of every other lease; its statements
-- at READ COMMITTED whatever the role's default (a renewal under SERIALIZABLE fails on every
-- concurrent `done`); and no `idle_session_timeout` (it waits idle while no job is held).
SELECT set_config('lock_timeout', %(timeout_ms)s::text, false) AS lock_timeout,
       set_config('statement_timeout', %(timeout_ms)s::text, false) AS statement_timeout,
       set_config('default_transaction_isolation', 'read committed',
                  false) AS default_transaction_isolation,
       set_config('idle_session_timeout', '0', false) AS idle_session_timeout;

-- name: lease_transaction :one
-- `lease_session`'s timeouts for one transaction only (SET LOCAL), for a lease connection
-- behind a transaction pooler, where a session setting would stay on whichever server
-- connection ran it, under other clients (their statements cancelled after %(timeout_ms)s ms).
SELECT set_config('lock_timeout', %(timeout_ms)s::text, true) AS lock_timeout,
       set_config('statement_timeout', %(timeout_ms)s::text, true) AS statement_timeout;

-- name: claim_transaction :one
-- `claim_session`'s settings for one claim transaction only (SET LOCAL), for a claim
-- connection behind a transaction pooler, where a session setting would stay on whichever
-- server connection ran it, under other clients. No prepared statements there, so no plan
-- cache to steer.
SELECT set_config('enable_seqscan', 'off', true) AS seqscan,
       set_config('enable_bitmapscan', 'off', true) AS bitmapscan,
       set_config('jit', 'off', true) AS jit;

-- name: renew_leases :many
-- Renew the lease of this worker's running jobs for %(lease)s seconds from now; returns the ids
-- it still holds, each with `renewed`: false for a row another session holds locked (a handler
-- locking its own job's row, a long transaction of an admin), still this worker's claim as last
-- committed, renewed at a later call. Waiting for that lock would hold up the renewal of every
-- other job of the worker until their leases lapsed, and they would run a second time.
WITH locked AS (
    -- each row by one descent of ix_aa_job_running (claimed_by, id) (the lateral subquery,
    -- kept apart by OFFSET 0): the ids as a filter of this worker's entries would walk every
    -- one of them, which a snapshot held open keeps for each job it claimed since
    SELECT j.id
      FROM (SELECT DISTINCT unnest(%(ids)s::bigint[]) AS id ORDER BY id) i
      CROSS JOIN LATERAL (
            SELECT j.id FROM mdm.aa_job j
             WHERE j.id = i.id AND j.status = 'running' AND j.claimed_by = %(worker_id)s
             OFFSET 0
               FOR NO KEY UPDATE SKIP LOCKED) j
), renewed AS (
    UPDATE mdm.aa_job j
       SET heartbeat_at = clock_timestamp(),
           lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
     -- by primary key alone (`locked` holds the rows, checked there); the locked ids as one
     -- array, read once: a join with the locked rows may be planned as a rescan of them per
     -- row (quadratic in the jobs held)
     WHERE j.id = ANY ((SELECT array_agg(id) FROM locked)::bigint[])
    RETURNING j.id
)
SELECT id, true AS renewed FROM renewed
UNION ALL
SELECT j.id, false
  FROM (SELECT DISTINCT unnest(%(ids)s::bigint[]) AS id) i
  CROSS JOIN LATERAL (
        SELECT j.id FROM mdm.aa_job j
         WHERE j.id = i.id AND j.status = 'running' AND j.claimed_by = %(worker_id)s
         OFFSET 0) j
 WHERE j.id <> ALL (coalesce((SELECT array_agg(id) FROM locked), '{}')::bigint[]);

-- name: stopped_jobs :many
-- Which of the given jobs carry the manual stop flag `failed`: of the claims a lease renewal
-- found gone, those a stop took away (the others were taken back by stale-claim recovery).
SELECT id FROM mdm.aa_job WHERE id = ANY(%(ids)s::bigint[]) AND status = 'failed';

-- name: release_unrun_claims :many
-- Hand back this worker's running jobs other than %(running)s: claims that committed while
-- the worker saw its connection fail, so it never ran them. Pending again at their place in
-- the queue, the attempt not counted.
-- Idle workers are woken at commit, as an enqueue wakes them.
WITH released AS (
    UPDATE mdm.aa_job
       SET status = 'pending', attempts = attempts - 1,
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL
     WHERE status = 'running' AND claimed_by = %(worker_id)s
       AND id <> ALL(%(running)s::bigint[])
    RETURNING id, job_kind
), notified AS (
    SELECT pg_notify('jobpool', job_kind) FROM (SELECT DISTINCT job_kind FROM released) AS d
)
SELECT id, job_kind FROM released, (SELECT count(*) FROM notified) AS n;
