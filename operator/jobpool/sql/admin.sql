-- Bookkeeping queries: migrations, the listener, the clock.

-- name: migration_lock :exec
-- Serialise migrations across processes (session-level advisory lock).
SELECT pg_advisory_lock(%(key)s);

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

-- name: listen_for_jobs :exec
-- Subscribe to the channel that enqueues notify (payload: the job kind).
LISTEN jobpool;

-- name: ping :one
-- Check that a connection is alive.
SELECT 1 AS alive;

-- name: reset_session :one
-- Undo what a job's handler left in its session, in one round trip (simple protocol), and
-- count the prepared statements left (psycopg's own: a handler may have deallocated them).
-- DISCARD ALL, but of the prepared statements only those made by SQL PREPARE (a handler's,
-- which may hold the names psycopg gives its own next), never psycopg's (protocol-level).
RESET ALL;
SET SESSION AUTHORIZATION DEFAULT;
UNLISTEN *;
CLOSE ALL;
SELECT pg_advisory_unlock_all();
DISCARD TEMP;
DISCARD SEQUENCES;
DO $$
DECLARE
    statement record;
BEGIN
    FOR statement IN SELECT name FROM pg_catalog.pg_prepared_statements WHERE from_sql LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement.name);
    END LOOP;
END
$$;
SELECT pg_catalog.count(*) AS prepared FROM pg_catalog.pg_prepared_statements;

-- name: database_now :one
-- The database's clock (all job times come from it).
SELECT now() AS now;

-- name: suppress_address :exec
-- Add an address to a tenant's email suppression list.
INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)
VALUES (%(tenant_id)s, lower(%(address)s), %(reason)s)
ON CONFLICT (tenant_id, address) DO NOTHING;
