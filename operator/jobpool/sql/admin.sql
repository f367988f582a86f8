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
-- Undo what a job's handler left in its session, in one round trip (simple protocol): what
-- DISCARD ALL does but DEALLOCATE ALL, which would drop psycopg's prepared statements (made
-- by the protocol). Returns how many of those are left (a handler may have deallocated
-- some) and the names of the statements SQL PREPARE made (a handler's: they may hold the
-- names psycopg gives its own next), for `deallocate`.
RESET ALL;
SET SESSION AUTHORIZATION DEFAULT;
UNLISTEN *;
CLOSE ALL;
SELECT pg_advisory_unlock_all();
DISCARD TEMP;
DISCARD SEQUENCES;
SELECT pg_catalog.count(*) FILTER (WHERE NOT from_sql) AS prepared,
       pg_catalog.array_agg(name) FILTER (WHERE from_sql) AS handler_made
  FROM pg_catalog.pg_prepared_statements;

-- name: deallocate :exec
-- Drop one prepared statement; psycopg.sql.SQL(...).format(): {name} is a sql.Identifier.
DEALLOCATE {name};

-- name: database_now :one
-- The database's clock (all job times come from it).
SELECT now() AS now;

-- name: suppress_address :exec
-- Add an address to a tenant's email suppression list.
INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)
VALUES (%(tenant_id)s, lower(%(address)s), %(reason)s)
ON CONFLICT (tenant_id, address) DO NOTHING;
