-- The queue's named queries. Parameters are psycopg's %(name)s placeholders.
-- Every change to a running job is a compare-and-set on (status, claimed_by, attempts).

-- name: register_kinds :exec
-- Insert or update the defaults of the kinds a worker serves.
INSERT INTO mdm.aa_job_kind (name, priority, max_attempts, stale_ttl)
SELECT name, priority, max_attempts, make_interval(secs => stale_ttl)
  FROM unnest(%(names)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
              %(stale_ttls)s::float8[]) AS k(name, priority, max_attempts, stale_ttl)
ON CONFLICT (name) DO UPDATE
   SET priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
       stale_ttl = EXCLUDED.stale_ttl, registered_at = now()
 WHERE (aa_job_kind.priority, aa_job_kind.max_attempts, aa_job_kind.stale_ttl)
       IS DISTINCT FROM (EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.stale_ttl);

-- name: enqueue_jobs :many
-- Insert jobs (kind defaults fill priority and max_attempts), audit them, and unless
-- %(notify)s is false wake workers at commit (one NOTIFY per kind and transaction).
WITH input AS (
    -- %(jobs)s: one JSON array of {tenant_id, job_kind, payload, priority, available_at,
    -- idempotency_key, max_attempts} (one parameter is cheaper to send than seven arrays)
    SELECT j.*, e.ord
      FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS e(job, ord),
           jsonb_to_record(e.job) AS j(tenant_id uuid, job_kind text, payload jsonb,
                                       priority smallint, available_at timestamptz,
                                       idempotency_key text, max_attempts int)
), inserted AS (
    INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at,
                            idempotency_key, max_attempts)
    SELECT i.tenant_id, i.job_kind, i.payload, coalesce(i.priority, k.priority, 100),
           coalesce(i.available_at, now()), i.idempotency_key,
           coalesce(i.max_attempts, k.max_attempts, 1)
      FROM input i LEFT JOIN mdm.aa_job_kind k ON k.name = i.job_kind
     ORDER BY i.ord
    ON CONFLICT (tenant_id, job_kind, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING id, tenant_id, job_kind, idempotency_key
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT coalesce(%(actor)s, current_user), tenant_id, id, 'job_enqueued',
           jsonb_build_object('kind', job_kind)
      FROM inserted
), notified AS (
    SELECT pg_notify('jobpool', job_kind) FROM (SELECT DISTINCT job_kind FROM inserted) AS d
     WHERE %(notify)s::bool
)
SELECT id, tenant_id, job_kind, idempotency_key, (SELECT count(*) FROM notified) AS notified
  FROM inserted
 ORDER BY id;

-- name: find_idempotent_jobs :many
-- The existing jobs that hold the given (tenant, kind, idempotency key) triples.
SELECT j.id, j.tenant_id, j.job_kind, j.idempotency_key
  FROM mdm.aa_job j
  JOIN unnest(%(tenant_ids)s::uuid[], %(kinds)s::text[], %(idempotency_keys)s::text[])
       AS k(tenant_id, job_kind, idempotency_key)
    ON (j.tenant_id, j.job_kind, j.idempotency_key) = (k.tenant_id, k.job_kind, k.idempotency_key);

-- name: claim_jobs :many
-- The single-statement claim of up to %(limit)s jobs (free slots), by lane, tenants taking turns.
-- Reads only what this worker could take, through ix_aa_job_lane (kind, tenant, priority,
-- available_at, id): the head (first ready job) of each (kind, tenant) pair it serves, found
-- by a loose index scan per kind (one descent per pair) or per pair of its own tenants; minus
-- the throttled pairs (%(throttled)s: 'tenant-uuid/kind', rate-limited until later). Rows of
-- the first %(limit)s pairs by (head priority, the pair's rank in its tenant, last turn) are
-- locked with SKIP LOCKED, at most as many per pair as it could win. Of those, the claim takes
-- by priority, then by the row's rank among its tenant's rows of that priority, then by the
-- tenant's last turn (mdm.aa_tenant_turn, oldest first), then by available_at: within a
-- priority level tenants take turns (round robin), across levels priority rules.
WITH RECURSIVE
kinds AS (
    SELECT DISTINCT unnest(%(kinds)s::text[]) AS job_kind
),
scanned AS (
    -- every tenant (%(tenants)s null): the head of each pair, walking the tenants of a kind
    SELECT h.*
      FROM kinds k
      CROSS JOIN LATERAL (
           SELECT j.job_kind, j.tenant_id, j.priority, j.available_at, j.id FROM mdm.aa_job j
            WHERE j.status = 'pending' AND j.job_kind = k.job_kind AND j.available_at <= now()
            ORDER BY j.tenant_id, j.priority, j.available_at, j.id
            LIMIT 1) h
     WHERE %(tenants)s::uuid[] IS NULL
    UNION ALL
    SELECT h.*
      FROM scanned s
      CROSS JOIN LATERAL (
           SELECT j.job_kind, j.tenant_id, j.priority, j.available_at, j.id FROM mdm.aa_job j
            WHERE j.status = 'pending' AND j.job_kind = s.job_kind AND j.tenant_id > s.tenant_id
              AND j.available_at <= now()
            ORDER BY j.tenant_id, j.priority, j.available_at, j.id
            LIMIT 1) h
),
heads AS (
    SELECT * FROM scanned
    UNION ALL
    -- the worker's own tenants: the head of each of their pairs
    SELECT h.*
      FROM kinds k
      CROSS JOIN (SELECT DISTINCT unnest(%(tenants)s::uuid[]) AS tenant_id) t
      CROSS JOIN LATERAL (
           SELECT j.job_kind, j.tenant_id, j.priority, j.available_at, j.id FROM mdm.aa_job j
            WHERE j.status = 'pending' AND j.job_kind = k.job_kind AND j.tenant_id = t.tenant_id
              AND j.available_at <= now()
            ORDER BY j.priority, j.available_at, j.id
            LIMIT 1) h
),
open_heads AS (
    -- heads of the pairs not throttled, with their tenant's last turn and rank in the tenant
    SELECT h.*, tt.turn_at,
           row_number() OVER (PARTITION BY h.tenant_id
                              ORDER BY h.priority, h.available_at, h.id) AS pair_rank
      FROM heads h
      LEFT JOIN mdm.aa_tenant_turn tt ON tt.tenant_id = h.tenant_id
     WHERE NOT EXISTS (SELECT 1 FROM unnest(%(throttled)s::text[]) AS t(pair)
                        WHERE t.pair = h.tenant_id::text || '/' || h.job_kind)
),
chosen AS (
    SELECT job_kind, tenant_id, turn_at
      FROM open_heads
     ORDER BY priority, pair_rank, turn_at NULLS FIRST, available_at, id
     LIMIT %(limit)s
),
locked AS (
    SELECT r.id, r.tenant_id, r.priority, r.available_at, c.turn_at
      FROM chosen c
      CROSS JOIN LATERAL (
           SELECT j.id, j.tenant_id, j.priority, j.available_at FROM mdm.aa_job j
            WHERE j.status = 'pending' AND j.job_kind = c.job_kind
              AND j.tenant_id = c.tenant_id AND j.available_at <= now()
            ORDER BY j.priority, j.available_at, j.id
            LIMIT %(limit)s - (SELECT count(*) FROM chosen) + 1
              FOR UPDATE SKIP LOCKED) r
),
next AS (
    SELECT id, row_number() OVER (ORDER BY priority, turn, turn_at NULLS FIRST, available_at,
                                           id) AS ord
      FROM (SELECT l.*, row_number() OVER (PARTITION BY l.tenant_id, l.priority
                                           ORDER BY l.available_at, l.id) AS turn
              FROM locked l) AS ranked
     ORDER BY ord
     LIMIT %(limit)s
),
claimed AS (
    -- by primary key: the plan is made once for any %(limit)s, and a join could scan the table
    UPDATE mdm.aa_job j
       SET status = 'running', claimed_by = %(worker_id)s, claimed_at = now(),
           heartbeat_at = now(), attempts = j.attempts + 1
     WHERE j.id = ANY (ARRAY(SELECT id FROM next))
    RETURNING j.id, j.tenant_id, j.job_kind, j.payload, j.status::text AS status, j.priority,
              j.available_at, j.created_at, j.claimed_by, j.claimed_at, j.attempts,
              j.max_attempts, j.last_error, j.idempotency_key,
              -- epochs, not a difference of timestamps: that fails for an infinite created_at
              (extract(epoch FROM j.claimed_at) - extract(epoch FROM j.created_at))::float8
                  AS claim_latency
),
turned AS (
    -- the served tenants go to the back of the line; a turn row another claim holds is
    -- skipped (that claim sets the same time), so claims never wait for each other here
    UPDATE mdm.aa_tenant_turn t
       SET turn_at = now()
      FROM (SELECT tt.tenant_id FROM mdm.aa_tenant_turn tt
             WHERE tt.tenant_id IN (SELECT tenant_id FROM claimed)
             ORDER BY tt.tenant_id
               FOR UPDATE SKIP LOCKED) AS free
     WHERE t.tenant_id = free.tenant_id
),
first_turns AS (
    -- a tenant's first turn; in tenant order, so two claims meeting new tenants never deadlock
    INSERT INTO mdm.aa_tenant_turn (tenant_id, turn_at)
    SELECT DISTINCT c.tenant_id, now() FROM claimed c
     WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_tenant_turn tt WHERE tt.tenant_id = c.tenant_id)
     ORDER BY c.tenant_id
    ON CONFLICT (tenant_id) DO NOTHING
)
SELECT c.* FROM claimed c JOIN next n ON n.id = c.id ORDER BY n.ord;

-- name: complete_job :one
-- Mark a job done (with the handler's result) if this worker still holds its claim.
WITH done AS (
    UPDATE mdm.aa_job
       SET status = 'done', completed_at = clock_timestamp(), last_error = NULL,
           heartbeat_at = NULL, result = %(result)s::jsonb
     WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
       AND attempts = %(attempts)s
    RETURNING id, tenant_id, job_kind
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_done', jsonb_build_object('kind', job_kind) FROM done
)
SELECT count(*)::int AS changed FROM done;

-- name: complete_jobs :many
-- Mark done, in one statement, jobs whose handlers wrote nothing; each only if still claimed.
WITH input AS (
    SELECT *
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::jsonb[])
           AS i(id, attempts, result)
), locked AS (
    -- rows are locked in id order, as renew_leases does, so the two never deadlock
    SELECT j.id, i.result
      FROM mdm.aa_job j JOIN input i ON i.id = j.id
     WHERE j.status = 'running' AND j.claimed_by = %(worker_id)s AND j.attempts = i.attempts
     ORDER BY j.id
       FOR UPDATE OF j
), done AS (
    UPDATE mdm.aa_job j
       SET status = 'done', completed_at = clock_timestamp(), last_error = NULL,
           heartbeat_at = NULL, result = locked.result
      FROM locked
     WHERE j.id = locked.id AND j.status = 'running' AND j.claimed_by = %(worker_id)s
    RETURNING j.id, j.tenant_id, j.job_kind
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_done', jsonb_build_object('kind', job_kind) FROM done
)
SELECT id FROM done;

-- name: completed_before :many
-- Of `done`s sent again after a connection failure hid the commit of the first try, those
-- that first try did commit (run only then: every batch would pay for the look-up).
SELECT j.id
  FROM mdm.aa_job j
  JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts) ON i.id = j.id
 WHERE j.status = 'done' AND j.claimed_by = %(worker_id)s AND j.attempts = i.attempts;

-- name: commit_without_flush :one
-- Let this transaction's COMMIT return before its WAL reaches disk (only a server crash undoes it).
SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit;

-- name: plan_claim :one
-- Plan the claim once per connection and walk ix_aa_job_lane even without statistics.
-- The claim's shape fixes its plan (index descents per pair, look-ups by key), so the generic
-- plan of the prepared statement serves every parameter: planning its CTEs on every call would
-- cost more than running them. It walks ix_aa_job_lane also before the table has statistics (a
-- freshly filled queue), and never pays JIT compilation for a statement of milliseconds.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode,
       set_config('enable_seqscan', 'off', true) AS seqscan,
       set_config('enable_bitmapscan', 'off', true) AS bitmapscan,
       set_config('jit', 'off', true) AS jit;

-- name: retry_job :one
-- Back to pending after a transient failure; the delay counts from now, not the transaction start.
UPDATE mdm.aa_job
   SET status = 'pending', available_at = clock_timestamp() + make_interval(secs => %(delay)s),
       last_error = %(error)s, claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL
 WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
   AND attempts = %(attempts)s
RETURNING id;

-- name: dead_letter_job :one
-- Park a job in the DLQ and audit it with its last error.
WITH parked AS (
    UPDATE mdm.aa_job
       SET status = 'dlq', completed_at = clock_timestamp(), last_error = %(error)s,
           heartbeat_at = NULL
     WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
       AND attempts = %(attempts)s
    RETURNING id, tenant_id, job_kind, attempts
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_dlq',
           jsonb_build_object('kind', job_kind, 'last_error', %(error)s::text,
                              'attempts', attempts)
      FROM parked
)
SELECT id FROM parked;

-- name: release_job :one
-- Hand a claimed job back without using up its attempt: after a delay (rate limit), or at
-- once (shutdown), then keeping its place in the queue.
UPDATE mdm.aa_job
   SET status = 'pending', attempts = attempts - 1,
       available_at = CASE WHEN %(delay)s::float8 > 0
                           THEN clock_timestamp() + make_interval(secs => %(delay)s::float8)
                           ELSE available_at END,
       claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL
 WHERE id = %(id)s AND status = 'running' AND claimed_by = %(worker_id)s
   AND attempts = %(attempts)s
RETURNING id;

-- name: release_unrun_claims :many
-- Hand back this worker's running jobs other than %(running)s: claims that committed while
-- the worker saw its connection fail, so it never ran them. Pending again at their place in
-- the queue, the attempt not counted.
-- Idle workers are woken at commit, as an enqueue wakes them.
WITH released AS (
    UPDATE mdm.aa_job
       SET status = 'pending', attempts = attempts - 1,
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL
     WHERE status = 'running' AND claimed_by = %(worker_id)s
       AND id <> ALL(%(running)s::bigint[])
    RETURNING id, job_kind
), notified AS (
    SELECT pg_notify('jobpool', job_kind) FROM (SELECT DISTINCT job_kind FROM released) AS d
)
SELECT id, job_kind FROM released, (SELECT count(*) FROM notified) AS n;

-- name: renew_leases :many
-- Renew the lease of this worker's running jobs; returns the ids it still holds.
WITH locked AS (
    -- rows are locked in id order, as complete_jobs does, so the two never deadlock
    SELECT id
      FROM mdm.aa_job
     WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running' AND claimed_by = %(worker_id)s
     ORDER BY id
       FOR UPDATE
)
UPDATE mdm.aa_job j
   SET heartbeat_at = clock_timestamp()
  FROM locked
 WHERE j.id = locked.id AND j.status = 'running' AND j.claimed_by = %(worker_id)s
RETURNING j.id;

-- name: get_job :one
-- One job with every column, if its tenant is among the given keys (NULL: any tenant).
SELECT j.*, j.status::text AS status, t.key AS tenant_key
  FROM mdm.aa_job j JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE j.id = %(id)s
   AND (%(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[]));

-- name: list_dlq :many
-- DLQ jobs after a keyset cursor, optionally for one tenant and kind, oldest first, of the
-- tenants with the given keys (NULL: any tenant).
SELECT d.id, d.tenant_id, t.key AS tenant_key, d.job_kind, d.payload, d.last_error,
       d.attempts, d.max_attempts, d.created_at, d.dlq_at
  FROM mdm.v_job_dlq d JOIN mdm.aa_tenant t ON t.id = d.tenant_id
 WHERE d.id > %(after)s
   AND (%(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[]))
   AND (%(tenant_id)s::uuid IS NULL OR d.tenant_id = %(tenant_id)s::uuid)
   AND (%(kind)s::text IS NULL OR d.job_kind = %(kind)s::text)
 ORDER BY d.id
 LIMIT %(limit)s;

-- name: replay_job :one
-- Put a DLQ job of the given tenants (NULL: any) back to pending with fresh attempts, and
-- audit the replay with the actor's tenant scope.
WITH replayed AS (
    UPDATE mdm.aa_job
       SET status = 'pending', attempts = 0, available_at = now(), completed_at = NULL,
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL
     WHERE id = %(id)s AND status = 'dlq'
       AND (%(tenants)s::text[] IS NULL
            OR tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
    RETURNING id, tenant_id, job_kind, last_error
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_replay',
           jsonb_build_object('kind', job_kind, 'last_error', last_error,
                              'tenant_scope', %(scope)s::jsonb)
      FROM replayed
), notified AS (
    -- wake idle workers at commit, as an enqueue does
    SELECT pg_notify('jobpool', job_kind) FROM replayed
)
SELECT id FROM replayed, (SELECT count(*) FROM notified) AS n;

-- name: discard_job :one
-- Delete a DLQ or stopped job of the given tenants (NULL: any), and audit it with a snapshot
-- of the row and the actor's tenant scope.
WITH discarded AS (
    DELETE FROM mdm.aa_job
     WHERE id = %(id)s AND status IN ('dlq', 'failed')
       AND (%(tenants)s::text[] IS NULL
            OR tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
    RETURNING *
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_discard',
           to_jsonb(discarded) || jsonb_build_object('tenant_scope', %(scope)s::jsonb)
      FROM discarded
)
SELECT id FROM discarded;

-- name: stop_job :one
-- Set the manual stop flag `failed` on a job of the given tenants (NULL: any) that is not
-- finished, and audit it with the actor's tenant scope.
WITH stopped AS (
    UPDATE mdm.aa_job
       SET status = 'failed', completed_at = clock_timestamp(),
           claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL
     WHERE id = %(id)s AND status IN ('pending', 'running', 'dlq')
       AND (%(tenants)s::text[] IS NULL
            OR tenant_id IN (SELECT id FROM mdm.aa_tenant WHERE key = ANY(%(tenants)s::text[])))
    RETURNING id, tenant_id, job_kind
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, id, 'job_stop',
           jsonb_build_object('kind', job_kind, 'tenant_scope', %(scope)s::jsonb)
      FROM stopped
)
SELECT id FROM stopped;

-- name: job_counts :many
-- Job counts per tenant, kind and status (finished jobs included), of the tenants with the
-- given keys (NULL: every tenant).
SELECT t.key AS tenant_key, j.tenant_id, j.job_kind, j.status::text AS status,
       count(*)::bigint AS jobs
  FROM mdm.aa_job j JOIN mdm.aa_tenant t ON t.id = j.tenant_id
 WHERE %(tenants)s::text[] IS NULL OR t.key = ANY(%(tenants)s::text[])
 GROUP BY t.key, j.tenant_id, j.job_kind, j.status
 ORDER BY t.key, j.job_kind, j.status;

-- name: resolve_tenant :one
-- A tenant by key or by id (one of the two is null).
SELECT id, key FROM mdm.aa_tenant WHERE key = %(key)s::text OR id = %(id)s::uuid;

-- name: create_tenant :one
-- Add a tenant; an existing key keeps its row and gets the given metadata merged in.
INSERT INTO mdm.aa_tenant (key, metadata) VALUES (%(key)s, %(metadata)s::jsonb)
ON CONFLICT (key) DO UPDATE SET metadata = aa_tenant.metadata || EXCLUDED.metadata
RETURNING id, key;

-- name: list_tenants :many
-- Every tenant.
SELECT id, key, metadata FROM mdm.aa_tenant ORDER BY key;

-- name: list_kinds :many
-- Every registered kind with its defaults.
SELECT name, priority, max_attempts, extract(epoch FROM stale_ttl)::float8 AS stale_ttl,
       registered_at
  FROM mdm.aa_job_kind ORDER BY name;

-- name: suppressed_address :one
-- Whether the tenant suppresses mail to this address, given in each of its spellings
-- (Unicode and IDNA domain): the list stores lower-cased addresses as they were added.
SELECT reason FROM mdm.aa_email_suppression
 WHERE tenant_id = %(tenant_id)s
   AND address IN (SELECT lower(a) FROM unnest(%(addresses)s::text[]) AS a)
 LIMIT 1;

-- name: log_email :one
-- Record a sent or suppressed email once per provider message id; audit a send.
WITH logged AS (
    INSERT INTO mdm.aa_email_log (tenant_id, job_id, provider_message_id, recipient, subject, status)
    VALUES (%(tenant_id)s, %(job_id)s, %(message_id)s, %(recipient)s, %(subject)s, %(status)s)
    ON CONFLICT (provider_message_id) DO NOTHING
    RETURNING id, tenant_id, job_id, provider_message_id, status
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, job_id, 'email_sent',
           jsonb_build_object('message_id', provider_message_id)
      FROM logged WHERE status = 'sent'
)
SELECT count(*)::int AS logged FROM logged;
