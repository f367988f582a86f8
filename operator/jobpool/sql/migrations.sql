-- The schema's migrations: their lock and the table that records them.

-- name: migration_lock :one
-- Serialise migrations across processes (session-level advisory lock), without waiting: a
-- session blocked in pg_advisory_lock holds a snapshot that CREATE INDEX CONCURRENTLY waits for.
SELECT pg_try_advisory_lock(%(key)s) AS locked;

-- name: migration_unlock :exec
-- Release the migration lock.
SELECT pg_advisory_unlock(%(key)s);

-- name: create_migration_table :exec
-- The table that records applied migrations.
CREATE SCHEMA IF NOT EXISTS mdm;
CREATE TABLE IF NOT EXISTS mdm.jobpool_migration (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_table_exists :one
-- Whether the migrations table exists yet.
SELECT to_regclass('mdm.jobpool_migration') IS NOT NULL AS present;

-- name: applied_migrations :many
-- Versions already applied.
SELECT version FROM mdm.jobpool_migration;

-- name: record_migration :exec
-- Record one applied migration.
INSERT INTO mdm.jobpool_migration (version, name) VALUES (%(version)s, %(name)s);

-- name: set_lock_timeout :exec
-- How long the migration session's next statements wait for a lock, in milliseconds (0: no
-- limit), for the session: the migrations run with autocommit, or set it again per transaction.
SELECT pg_catalog.set_config('lock_timeout', %(ms)s, false);

-- name: reset_lock_timeout :exec
-- The session's own lock_timeout again (its role's, its connection string's, the server's).
RESET lock_timeout;

-- name: lock_holders :many
-- The other sessions whose transactions, open for more than %(older_than)s seconds, hold a lock
-- on a table of schema mdm: what a migration's statement that gave up waiting waited for.
-- Their state and query read NULL to a role that may not see other roles' sessions.
SELECT a.pid, a.usename AS role, a.application_name, a.state,
       extract(epoch FROM pg_catalog.now() - a.xact_start)::float8 AS open_for,
       pg_catalog.left(a.query, 200) AS query,
       pg_catalog.string_agg(DISTINCT c.relname::text, ', ') AS tables
  FROM pg_catalog.pg_locks l
  JOIN pg_catalog.pg_class c ON c.oid = l.relation
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
 WHERE n.nspname = 'mdm' AND c.relkind IN ('r', 'p') AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
   AND a.xact_start < pg_catalog.now() - pg_catalog.make_interval(secs => %(older_than)s)
 GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start, a.query
 ORDER BY a.xact_start
 LIMIT 10;
