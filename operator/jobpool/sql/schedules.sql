-- Schedules (worker/scheduler.py): their declarations, the due rows workers lock, their
-- bookkeeping, and what status shows. Parameters are psycopg's %(name)s placeholders.

-- name: schedule_clock :one
-- The database's clock: every process reads ticks against the same time.
SELECT clock_timestamp() AS now;

-- name: declare_schedule :one
-- Insert or replace a schedule's declaration; a changed declaration starts again from its
-- %(next_run_at)s (no tick of the old one is enqueued after), an unchanged one keeps its place.
-- A row of another owner is left alone (declared_elsewhere finds it, and the declaration is
-- refused): a name is one schedule of one pool, which alone may change or retire it.
INSERT INTO mdm.aa_schedule AS s (name, owner, job_kind, tenant, expression, time_zone, missed,
                                  definition, next_run_at)
VALUES (%(name)s, %(owner)s, %(kind)s, %(tenant)s, %(expression)s, %(time_zone)s, %(missed)s,
        %(definition)s, %(next_run_at)s)
ON CONFLICT (name) DO UPDATE
   SET owner = excluded.owner, job_kind = excluded.job_kind, tenant = excluded.tenant,
       expression = excluded.expression, time_zone = excluded.time_zone,
       missed = excluded.missed, definition = excluded.definition,
       next_run_at = excluded.next_run_at, last_error = NULL, declared_at = now()
 WHERE s.owner = excluded.owner AND s.definition IS DISTINCT FROM excluded.definition
RETURNING s.name;

-- name: take_over_schedules :many
-- Make %(owner)s the owner of the schedules named %(names)s that one of its former owner names %(former)s declared (an earlier version named a pool's schedules by the pool's name alone): they keep their place, and the pool alone changes and retires them from now on.
UPDATE mdm.aa_schedule
   SET owner = %(owner)s
 WHERE name = ANY(%(names)s::text[]) AND owner = ANY(%(former)s::text[])
RETURNING name;

-- name: declared_elsewhere :many
-- The schedules named %(names)s that an owner other than %(owner)s declared, with their declarations.
SELECT name, owner, definition
  FROM mdm.aa_schedule
 WHERE name = ANY(%(names)s::text[]) AND owner <> %(owner)s
 ORDER BY name;

-- name: retire_schedules :many
-- Delete the schedules %(owner)s declared before that it no longer declares; never the
-- built-in ones (owner '').
DELETE FROM mdm.aa_schedule
 WHERE owner = %(owner)s AND owner <> '' AND NOT (name = ANY(%(names)s::text[]))
RETURNING name;

-- name: lock_due_schedules :many
-- The schedules whose next tick has come, locked for this transaction; rows another worker
-- holds are skipped (it is enqueueing their ticks), and so are the built-in schedules named in
-- %(unhandled)s, whose work this caller cannot do. The tenant reference is resolved to its id
-- (NULL: no such tenant).
SELECT s.name, s.definition, s.next_run_at, s.last_error, clock_timestamp() AS now,
       (SELECT t.id FROM mdm.aa_tenant t
         WHERE t.key = s.tenant OR t.id::text = s.tenant LIMIT 1) AS tenant_id
  FROM mdm.aa_schedule s
 WHERE s.next_run_at <= clock_timestamp() AND NOT (s.name = ANY(%(unhandled)s::text[]))
 ORDER BY s.next_run_at
 LIMIT %(limit)s
   FOR UPDATE OF s SKIP LOCKED;

-- name: record_schedule_run :exec
-- A schedule's bookkeeping after a check enqueued its due ticks (or failed to).
UPDATE mdm.aa_schedule
   SET next_run_at = %(next_run_at)s,
       last_run_at = coalesce(%(last_run_at)s, last_run_at),
       last_job_id = coalesce(%(last_job_id)s, last_job_id),
       missed_total = missed_total + %(missed)s,
       last_error = %(error)s
 WHERE name = %(name)s;

-- name: next_schedule_due :one
-- When the earliest schedule is next due (NULL: no schedule), and the database's clock.
SELECT min(next_run_at) AS next_due, clock_timestamp() AS now FROM mdm.aa_schedule;

-- name: list_schedules :many
-- Every schedule with its last and next run, for status, the API and the metrics.
SELECT name, owner, job_kind AS kind, tenant, expression, time_zone, missed, next_run_at,
       last_run_at, last_job_id, missed_total, last_error
  FROM mdm.aa_schedule
 ORDER BY name;

-- name: schedule_runs :many
-- The owner of each schedule named %(names)s, and the last and next run of those %(owner)s owns (NULL for another owner's), for a JobWorkerPool's status: a pool shows its own runs, and who declared a name it cannot have.
SELECT s.name, s.owner, own.next_run_at, own.last_run_at, own.missed_total, own.last_error
  FROM mdm.aa_schedule s
  LEFT JOIN mdm.aa_schedule own ON own.name = s.name AND own.owner = %(owner)s
 WHERE s.name = ANY(%(names)s::text[])
 ORDER BY s.name;

-- name: retire_pool_schedules :many
-- Delete every schedule %(owner)s declared (a pool that is gone: its workers retire nothing
-- any more), never the built-in ones (owner ''), audited with their names and declarations.
WITH retired AS (
    DELETE FROM mdm.aa_schedule
     WHERE owner = %(owner)s AND owner <> ''
    RETURNING name, definition
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, action, payload)
    SELECT %(actor)s, 'schedules_retired',
           jsonb_build_object('owner', %(owner)s::text,
                              'schedules', jsonb_object_agg(name, definition))
      FROM retired
    HAVING count(*) > 0
)
SELECT name FROM retired ORDER BY name;

-- name: schedule_owners :many
-- Each pool that owns schedules, with how many (the built-in owner '' left out).
SELECT owner, count(*)::int AS schedules
  FROM mdm.aa_schedule WHERE owner <> '' GROUP BY owner ORDER BY owner;
