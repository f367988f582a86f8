-- Bookkeeping queries: migrations, the listener, the clock.

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

-- name: listen_for_jobs :exec
-- Subscribe to the channel that enqueues notify (payload: the job kind).
LISTEN jobpool;

-- name: ping :one
-- Check that a connection is alive.
SELECT 1 AS alive;

-- name: reset_session :exec
-- Undo what a job's handler left in its session, in one round trip (simple protocol).
-- DISCARD ALL without DEALLOCATE ALL, which would drop psycopg's prepared statements.
RESET ALL;
SET SESSION AUTHORIZATION DEFAULT;
UNLISTEN *;
CLOSE ALL;
SELECT pg_advisory_unlock_all();
DISCARD TEMP;
DISCARD SEQUENCES;

-- name: database_now :one
-- The database's clock (all job times come from it).
SELECT now() AS now;

-- name: suppress_address :exec
-- Add an address to a tenant's email suppression list.
INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)
VALUES (%(tenant_id)s, lower(%(address)s), %(reason)s)
ON CONFLICT (tenant_id, address) DO NOTHING;
