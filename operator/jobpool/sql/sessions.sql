-- Sessions: the listener, liveness, the reset after a job, the database's clock.

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
