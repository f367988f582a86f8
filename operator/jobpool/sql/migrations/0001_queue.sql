-- The queue: tenants, job kinds, jobs, audit, DLQ view, email log and suppression list.
CREATE SCHEMA IF NOT EXISTS mdm;

CREATE TABLE mdm.aa_tenant (
    id       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    key      text NOT NULL UNIQUE CHECK (key ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'
                                     AND key !~ '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'),
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(metadata) = 'object')
);

-- Platform-level jobs (cleanup_jobs) belong to this tenant.
INSERT INTO mdm.aa_tenant (id, key) VALUES ('00000000-0000-0000-0000-000000000000', 'system');

-- Every kind a worker can run; workers register theirs on start, so an enqueue of an
-- unknown kind fails on the foreign key instead of waiting forever for nobody.
CREATE TABLE mdm.aa_job_kind (
    name             text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    priority         smallint NOT NULL DEFAULT 100,
    max_attempts     integer  NOT NULL DEFAULT 20 CHECK (max_attempts >= 1),
    stale_ttl        interval NOT NULL DEFAULT '15 minutes' CHECK (stale_ttl > '0'::interval),
    registered_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TYPE mdm.job_status AS ENUM ('pending', 'running', 'done', 'dlq', 'failed');

CREATE TABLE mdm.aa_job (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    job_kind        text NOT NULL REFERENCES mdm.aa_job_kind (name),
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    status          mdm.job_status NOT NULL DEFAULT 'pending',
    priority        smallint NOT NULL DEFAULT 100,
    available_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    claimed_at      timestamptz,
    heartbeat_at    timestamptz,
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL CHECK (max_attempts >= 1),
    last_error      text CHECK (length(last_error) <= 4096),
    completed_at    timestamptz,
    idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 512),
    result          jsonb,
    -- impossible states are impossible
    CONSTRAINT aa_job_running_is_claimed CHECK (
        status <> 'running' OR (claimed_by IS NOT NULL AND claimed_at IS NOT NULL)),
    CONSTRAINT aa_job_pending_is_unclaimed CHECK (
        status <> 'pending' OR (claimed_by IS NULL AND claimed_at IS NULL)),
    CONSTRAINT aa_job_finished_has_completed_at CHECK (
        status NOT IN ('done', 'dlq') OR completed_at IS NOT NULL)
);

-- The claim walks this index in (priority, available_at) order and stops after LIMIT rows.
CREATE INDEX ix_aa_job_claim ON mdm.aa_job (priority, available_at) WHERE status = 'pending';
-- Stale-claim recovery and lease renewal touch only running rows.
CREATE INDEX ix_aa_job_running ON mdm.aa_job (claimed_by) WHERE status = 'running';
-- Done-job retention deletes the oldest first.
CREATE INDEX ix_aa_job_done ON mdm.aa_job (completed_at) WHERE status = 'done';
CREATE INDEX ix_aa_job_dlq ON mdm.aa_job (id) WHERE status = 'dlq';
CREATE UNIQUE INDEX ux_aa_job_idempotency ON mdm.aa_job (tenant_id, job_kind, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TYPE mdm.audit_action AS ENUM (
    'job_enqueued', 'job_done', 'job_dlq', 'job_replay', 'job_discard', 'job_stop', 'email_sent');

CREATE TABLE mdm.aa_audit_log (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                 timestamptz NOT NULL DEFAULT now(),
    actor_principal_id text NOT NULL,
    tenant_id          uuid,
    job_id             bigint,
    action             mdm.audit_action NOT NULL,
    payload            jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX ix_aa_audit_log_job ON mdm.aa_audit_log (job_id);

CREATE VIEW mdm.v_job_dlq AS
SELECT id, tenant_id, job_kind, payload, last_error, attempts, max_attempts, created_at,
       completed_at AS dlq_at
  FROM mdm.aa_job
 WHERE status = 'dlq';

CREATE TABLE mdm.aa_email_suppression (
    tenant_id  uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    address    text NOT NULL CHECK (address = lower(address)),
    reason     text NOT NULL DEFAULT 'manual',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, address)
);

CREATE TABLE mdm.aa_email_log (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id           uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    job_id              bigint NOT NULL,
    provider_message_id text NOT NULL UNIQUE,
    recipient           text NOT NULL,
    subject             text NOT NULL,
    status              text NOT NULL CHECK (status IN ('sent', 'suppressed')),
    created_at          timestamptz NOT NULL DEFAULT now()
);
