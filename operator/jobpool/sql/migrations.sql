-- The schema's migrations: their lock and the table that records them.

-- name: migration_lock :one
-- Serialise migrations across processes (session-level advisory lock), without waiting: a
-- session blocked in pg_advisory_lock holds a snapshot that CREATE INDEX CONCURRENTLY waits for.
SELECT pg_try_advisory_lock(%(key)s) AS locked;

-- name: migration_lock_holder :many
-- The session of this database that holds the migration lock %(key)s (a bigint key is held as
-- its high and low 32 bits), as `lock_holders` shows sessions (a session's lock: no gid), and
-- whether it is this one (`mine`).
SELECT l.pid, (l.pid = pg_catalog.pg_backend_pid()) AS mine, a.usename AS role,
       a.application_name, a.state,
       extract(epoch FROM pg_catalog.now() - a.xact_start)::float8 AS open_for,
       CASE WHEN a.query <> '<insufficient privilege>' THEN pg_catalog.left(a.query, 200) END
           AS query,
       NULL::text AS gid, NULL::text AS tables
  FROM pg_catalog.pg_locks l
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = pg_catalog.current_database())
   AND l.classid::bigint = (%(key)s::bigint >> 32)
   AND l.objid::bigint = (%(key)s::bigint & 4294967295);

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

-- name: session_settings :one
-- What the migration session runs with before `jobpool migrate` changes it (restored after).
SELECT pg_catalog.current_setting('lock_timeout') AS lock_timeout,
       pg_catalog.current_setting('statement_timeout') AS statement_timeout,
       pg_catalog.current_setting('idle_session_timeout') AS idle_session_timeout,
       pg_catalog.current_setting('application_name') AS application_name;

-- name: set_session_settings :exec
-- Set the migration session's lock, statement and idle timeouts and its name in
-- pg_stat_activity.
SELECT pg_catalog.set_config('lock_timeout', %(lock_timeout)s, false),
       pg_catalog.set_config('statement_timeout', %(statement_timeout)s, false),
       pg_catalog.set_config('idle_session_timeout', %(idle_session_timeout)s, false),
       pg_catalog.set_config('application_name', %(application_name)s, false);

-- name: backend_pid :one
-- The server process of this session (behind a session pooler, not the one libpq reports).
SELECT pg_catalog.pg_backend_pid() AS pid;

-- name: lock_holders :many
-- The other transactions of this database that hold a lock on a table of schema mdm (or on
-- one of its indexes, named by its table) and are
-- older than `older_than` seconds (or of an age this role may not see): what a migration's
-- statement that gave up waiting waited for. Another role's session shows its state, start
-- and query only to a superuser or a member of pg_read_all_stats. A prepared transaction has
-- no session (pid NULL): it is named by its gid, its owner and when it was prepared, found
-- through the lock on its transaction id that it holds under the same virtual transaction.
SELECT l.pid, coalesce(a.usename, p.owner) AS role, a.application_name, a.state,
       extract(epoch FROM pg_catalog.now() - coalesce(a.xact_start, p.prepared))::float8
           AS open_for,
       CASE WHEN a.query <> '<insufficient privilege>' THEN pg_catalog.left(a.query, 200) END
           AS query,
       p.gid,
       pg_catalog.string_agg(DISTINCT t.relname::text, ', ') AS tables
  FROM pg_catalog.pg_locks l
  JOIN pg_catalog.pg_class c ON c.oid = l.relation
  LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.oid
  JOIN pg_catalog.pg_class t ON t.oid = coalesce(i.indrelid, c.oid)
  JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
  LEFT JOIN pg_catalog.pg_locks x
    ON l.pid IS NULL AND x.pid IS NULL AND x.locktype = 'transactionid'
   AND x.virtualtransaction = l.virtualtransaction
  LEFT JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = x.transactionid
 WHERE l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = pg_catalog.current_database())
   AND n.nspname = 'mdm' AND l.granted
   AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
   AND (coalesce(a.xact_start, p.prepared) IS NULL
        OR coalesce(a.xact_start, p.prepared)
           < pg_catalog.now() - pg_catalog.make_interval(secs => %(older_than)s))
 GROUP BY l.pid, a.usename, a.application_name, a.state, a.xact_start, a.query, p.gid,
          p.owner, p.prepared
 ORDER BY coalesce(a.xact_start, p.prepared) NULLS LAST
 LIMIT 10;

-- name: blocking_sessions :many
-- The sessions that session `pid` waits for (a CONCURRENTLY step waits for the transactions
-- older than it, of any table of this database), as `lock_holders` shows them. A prepared
-- transaction, which pg_blocking_pids gives as 0 without saying which, stands for every
-- prepared transaction of this database: one row each, pid NULL.
SELECT NULLIF(b.pid, 0) AS pid, coalesce(a.usename, p.owner) AS role, a.application_name,
       a.state,
       extract(epoch FROM pg_catalog.now() - coalesce(a.xact_start, p.prepared))::float8
           AS open_for,
       CASE WHEN a.query <> '<insufficient privilege>' THEN pg_catalog.left(a.query, 200) END
           AS query,
       p.gid, NULL::text AS tables
  FROM (SELECT DISTINCT pid
          FROM pg_catalog.unnest(pg_catalog.pg_blocking_pids(%(pid)s)) AS u(pid)) AS b
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = b.pid
  LEFT JOIN pg_catalog.pg_prepared_xacts p
    ON b.pid = 0 AND p.database = pg_catalog.current_database()
 ORDER BY coalesce(a.xact_start, p.prepared) NULLS LAST
 LIMIT 10;

-- name: printed_script_check :exec
-- The first step of `jobpool migrate --print-sql --since N`: stop unless the database has
-- exactly versions 1 to N (`expected` says so in words), so that a script is never applied over
-- a gap (that version would be skipped for good), over later migrations, or to another database.
DO $check$
DECLARE
    have integer := 0;
    last integer := 0;
BEGIN
    IF pg_catalog.to_regclass('mdm.jobpool_migration') IS NOT NULL THEN
        SELECT pg_catalog.count(*), coalesce(pg_catalog.max(version), 0) INTO have, last
          FROM mdm.jobpool_migration;
    END IF;
    IF have <> %(since)s OR last <> %(since)s THEN
        RAISE EXCEPTION 'this script applies the jobpool migrations after version % to %; '
            'this one has % of them, the latest %: print the script for it with '
            '`jobpool migrate --print-sql --since` its latest version, or run '
            '`jobpool migrate`, which applies whatever it lacks',
            %(since)s, %(expected)s, have, last;
    END IF;
END
$check$;
