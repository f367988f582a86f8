-- Sessions: the listener, liveness, the reset after a job, the database's clock.

-- name: listen_for_jobs :exec
-- Subscribe to the channel that enqueues notify (payload: the job kind).
LISTEN jobpool;

-- name: listen_for_stops :exec
-- Subscribe to the channel that `stop_job` notifies (payload: the stopped job's id).
LISTEN jobpool_stop;

-- name: ping :one
-- Check that a connection is alive.
SELECT 1 AS alive;

-- name: reset_session :one
-- Undo what a job's handler left in its session (simple protocol, one round trip): its role
-- first, so that the rest runs as the worker's own (`mdm.aa_reset_session`, which returns how
-- many of the client's prepared statements are left and those SQL PREPARE made).
SET SESSION AUTHORIZATION DEFAULT;
SELECT prepared, handler_made FROM mdm.aa_reset_session();

-- name: check_deferred :exec
-- The first statement of a writing job's end: the handler's deferred constraints and
-- constraint triggers, checked now, under its settings and role, as its COMMIT would check
-- them before the session reset that follows undoes those (its DISCARD TEMP would drop a
-- temp table whose check is pending). A statement of its own, so that its failure (the
-- handler's) is told from the `done`'s.
SET CONSTRAINTS ALL IMMEDIATE;

-- name: end_without_timeout :exec
-- The second statement of a writing job's end, once the handler's deferred constraints were
-- checked under its settings: no statement or lock timeout for the rest of the job's
-- transaction, so that the handler's (a SET or SET LOCAL of a few milliseconds) cuts short
-- neither its `done`, which may wait for the job row's lock (a lease renewal holds it
-- briefly), nor the session reset: either cut short would roll the job and its writes back.
-- A statement of its own, before the `done`: a statement's timeout starts with it, at the
-- value then in force.
SELECT pg_catalog.set_config('statement_timeout', '0', true),
       pg_catalog.set_config('lock_timeout', '0', true);

-- name: reset_before_commit :one
-- The session reset of a writing job, inside its transaction after `mdm.aa_job_end` (which
-- brought the worker's role back; the handler's timeouts were lifted before it,
-- `end_without_timeout`) and before its COMMIT (the caller sends it after this), so that
-- the job is one transaction;
-- `mdm.aa_reset_session` keeps the handler's `synchronous_commit` for the COMMIT. Session
-- advisory locks the handler still holds are released here, just before its writes become
-- visible: a lock that must cover them until then is a transaction-level one, which the
-- COMMIT releases.
SELECT prepared, handler_made FROM mdm.aa_reset_session();

-- name: keep_when_idle_if_set :many
-- `keep_when_idle` for a session whose role or database sets an `idle_session_timeout`: one
-- row when it was set (the filter runs before the projection that turns it off), none else.
SELECT pg_catalog.set_config('idle_session_timeout', '0', false) AS idle_session_timeout
 WHERE pg_catalog.current_setting('idle_session_timeout') <> '0';

-- name: keep_when_idle :exec
-- A session jobpool keeps open waits idle by design (LISTEN between wake-ups, a slot between
-- writing jobs, the admin API's pool between requests, the queue gauges' between scrapes): an
-- `idle_session_timeout` of the role or database, meant for sessions a client forgot, would
-- close it again and again. Never sent behind a transaction pooler, where it would stay on a
-- server connection (the pooler, not the server, keeps the client's session there).
SET idle_session_timeout = 0;

-- name: job_end_functions_executable :one
-- Whether the connection's role may execute the functions a writing job ends with.
SELECT pg_catalog.has_function_privilege(
           'mdm.aa_job_end(bigint, integer, text, text, jsonb)', 'EXECUTE')
       AND pg_catalog.has_function_privilege(
           'mdm.aa_job_done(bigint, integer, text, text, jsonb, boolean)', 'EXECUTE')
       AND pg_catalog.has_function_privilege('mdm.aa_reset_session()', 'EXECUTE')
       AS executable;

-- name: deallocate :exec
-- Drop one prepared statement; psycopg.sql.SQL(...).format(): {name} is a sql.Identifier.
DEALLOCATE {name};

-- name: database_now :one
-- The database's clock (all job times come from it).
SELECT now() AS now;

-- name: connection_allowance :one
-- What the role and the server let this session's role open (`core.connection_budget`):
-- the role's CONNECTION LIMIT and its sessions across databases, the server's
-- max_connections, the connections a role without superuser may not use, every client
-- session now (this one included), and how many of the role's are the caller's own: this
-- one and those of the backend pids %(own)s (connections the caller kept through an outage,
-- or opened since: they are in its need, not taken by others).
SELECT r.rolname AS role, r.rolconnlimit AS role_limit,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity a
         WHERE a.usename = r.rolname AND a.backend_type = 'client backend')::int AS role_in_use,
       pg_catalog.current_setting('max_connections')::int AS server_max,
       CASE WHEN r.rolsuper THEN 0
            ELSE pg_catalog.current_setting('superuser_reserved_connections')::int
                 + coalesce(pg_catalog.current_setting('reserved_connections', true)::int, 0)
       END AS reserved,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity a
         WHERE a.backend_type = 'client backend')::int AS server_in_use,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity a
         WHERE a.usename = r.rolname AND a.backend_type = 'client backend'
           AND (a.pid = pg_catalog.pg_backend_pid()
                OR a.pid = ANY (%(own)s::int[])))::int AS held
  FROM pg_catalog.pg_roles r
 WHERE r.rolname = current_user;
