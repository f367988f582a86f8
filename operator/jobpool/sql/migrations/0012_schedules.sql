-- Schedules: one row per declared schedule (pool files, the JobWorkerPool CRD, code) and the
-- built-in `cleanup_jobs`. Workers lock the rows that are due (FOR UPDATE SKIP LOCKED), enqueue
-- each tick's job with the idempotency key `schedule:<name>:<tick>` and move `next_run_at` in
-- the same transaction: each tick is enqueued once however many workers check.
-- `mdm.aa_maintenance_run` is no longer written (maintenance runs as the built-in schedule);
-- workers of earlier versions still take turns through it while a rollout replaces them.
CREATE TABLE IF NOT EXISTS mdm.aa_schedule (
    name          text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    owner         text NOT NULL,            -- the declaring pool (JOBPOOL_POOL); '': built in
    job_kind      text NOT NULL,
    tenant        text NOT NULL,            -- a tenant key or id, as declared
    expression    text NOT NULL,            -- the cron expression, or 'every <n>s'
    time_zone     text,                     -- a cron schedule's IANA zone
    missed        text NOT NULL CHECK (missed IN ('skip', 'catch_up_once')),
    definition    jsonb NOT NULL,           -- the declaration (jobpool.core.schedules)
    next_run_at   timestamptz NOT NULL,     -- its first tick not yet enqueued
    last_run_at   timestamptz,              -- its latest tick enqueued
    last_job_id   bigint,
    missed_total  bigint NOT NULL DEFAULT 0 CHECK (missed_total >= 0),
    last_error    text CHECK (length(last_error) <= 4096),
    declared_at   timestamptz NOT NULL DEFAULT now()
);

-- Workers ask for the due rows, and for the earliest next tick, every few seconds.
CREATE INDEX IF NOT EXISTS ix_aa_schedule_next_run ON mdm.aa_schedule (next_run_at);
