-- The outbox (events, webhook subscriptions, per-delivery state) and attachments (virus scan).

-- New enum values may not be used in this transaction; nothing below uses them at run time.
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'webhook_disabled';
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'attachment_scanned';

-- Known before any worker starts, so services can write events and commit uploads at once.
-- Superseded by registration: `jobpool migrate` registers every built-in kind with the
-- defaults its declaration carries (jobpool.kinds), right after the migrations, and so does
-- each worker for its kinds. These rows only seed the kinds until then.
INSERT INTO mdm.aa_job_kind (name, priority, max_attempts, stale_ttl) VALUES
    ('outbox_dispatch', 100, 20, '5 minutes'),
    ('virus_scan', 100, 20, '15 minutes')
ON CONFLICT (name) DO NOTHING;

-- Events for external consumers (the job table is not an event bus: events outlive their jobs).
CREATE TABLE mdm.aa_outbox_event (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uid           uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    tenant_id     uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    event_type    text NOT NULL CHECK (
        length(event_type) <= 200 AND event_type ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$'),
    payload       jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The request body, fixed when the event is dispatched: every attempt sends these bytes.
    body          bytea,
    -- Dispatched: one delivery row (and job) exists per subscription that matched.
    dispatched_at timestamptz,
    CONSTRAINT aa_outbox_event_dispatched_has_body CHECK ((body IS NULL) = (dispatched_at IS NULL))
);
CREATE INDEX ix_aa_outbox_event_dispatched ON mdm.aa_outbox_event (dispatched_at)
    WHERE dispatched_at IS NOT NULL;

CREATE TABLE mdm.aa_webhook_subscription (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    url                text NOT NULL CHECK (url ~* '^https?://[^\s]+$' AND length(url) <= 2048),
    -- Standard Webhooks secret `whsec_<base64>`; the HMAC key, so it is stored as is.
    secret             text NOT NULL CHECK (secret ~ '^whsec_[A-Za-z0-9+/=]+$'),
    -- Event types delivered; '*' delivers every type.
    event_types        text[] NOT NULL CHECK (cardinality(event_types) >= 1),
    active             boolean NOT NULL DEFAULT true,
    created_at         timestamptz NOT NULL DEFAULT now(),
    deactivated_at     timestamptz,
    deactivated_reason text,
    CONSTRAINT aa_webhook_subscription_inactive_has_time CHECK (active = (deactivated_at IS NULL))
);
CREATE INDEX ix_aa_webhook_subscription_tenant ON mdm.aa_webhook_subscription (tenant_id)
    WHERE active;

CREATE TYPE mdm.webhook_delivery_status AS ENUM ('pending', 'delivered', 'failed', 'gone', 'skipped');

-- One row per (event, subscription): its own job, retries and DLQ entry.
CREATE TABLE mdm.aa_webhook_delivery (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         bigint NOT NULL REFERENCES mdm.aa_outbox_event (id) ON DELETE CASCADE,
    subscription_id  bigint NOT NULL REFERENCES mdm.aa_webhook_subscription (id) ON DELETE CASCADE,
    tenant_id        uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    -- The `webhook-id` header: the same on every attempt and on a DLQ replay.
    webhook_id       text NOT NULL UNIQUE,
    status           mdm.webhook_delivery_status NOT NULL DEFAULT 'pending',
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_status_code integer,
    last_error       text CHECK (length(last_error) <= 4096),
    last_attempt_at  timestamptz,
    delivered_at     timestamptz,
    -- The outbox_dispatch job delivering it (no foreign key: done jobs are deleted).
    job_id           bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT aa_webhook_delivery_once UNIQUE (event_id, subscription_id),
    CONSTRAINT aa_webhook_delivery_delivered_has_time CHECK (
        (status = 'delivered') = (delivered_at IS NOT NULL))
);
CREATE INDEX ix_aa_webhook_delivery_pending ON mdm.aa_webhook_delivery (event_id)
    WHERE status = 'pending';
CREATE INDEX ix_aa_webhook_delivery_subscription ON mdm.aa_webhook_delivery (subscription_id);

-- A trigger, not only a library call, turns every inserted event into an
-- outbox_dispatch job in the inserting transaction, whoever inserts it (jobpool.outbox.publish,
-- plain SQL, a service in another language, a data migration). One job per event; it fans
-- out to one delivery job per matching subscription.
CREATE FUNCTION mdm.aa_outbox_event_enqueue() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_events) THEN
        RETURN NULL;
    END IF;
    WITH inserted AS (
        INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, max_attempts,
                                idempotency_key)
        SELECT e.tenant_id, 'outbox_dispatch', jsonb_build_object('event_id', e.id),
               coalesce(k.priority, 100), coalesce(k.max_attempts, 20),
               'outbox_event:' || e.id
          FROM new_events e
          LEFT JOIN mdm.aa_job_kind k ON k.name = 'outbox_dispatch'
         ORDER BY e.id
        ON CONFLICT (tenant_id, job_kind, idempotency_key) WHERE idempotency_key IS NOT NULL
        DO NOTHING
        RETURNING id, tenant_id
    )
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT current_user, tenant_id, id, 'job_enqueued',
           jsonb_build_object('kind', 'outbox_dispatch')
      FROM inserted;
    PERFORM pg_notify('jobpool', 'outbox_dispatch');
    RETURN NULL;
END;
$$;

CREATE TRIGGER aa_outbox_event_enqueue
    AFTER INSERT ON mdm.aa_outbox_event
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION mdm.aa_outbox_event_enqueue();

CREATE TYPE mdm.virus_scan_status AS ENUM ('pending', 'clean', 'infected', 'unscannable');

-- An uploaded object. `clean` if and only if clamd answered `stream: OK` for these bytes.
CREATE TABLE mdm.ddm_attachment (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id         uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    file_name         text NOT NULL CHECK (length(file_name) BETWEEN 1 AND 255),
    content_type      text NOT NULL CHECK (length(content_type) BETWEEN 1 AND 255),
    size_bytes        bigint NOT NULL CHECK (size_bytes >= 0),
    storage_uri       text NOT NULL CHECK (storage_uri ~ '^[a-z][a-z0-9+.-]*://'),
    sha256            text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    virus_scan_status mdm.virus_scan_status NOT NULL DEFAULT 'pending',
    -- The signature clamd named (infected only).
    virus_signature   text,
    -- Why the object is unscannable.
    scan_detail       text CHECK (length(scan_detail) <= 4096),
    scanned_at        timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    committed_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ddm_attachment_infected_has_signature CHECK (
        (virus_scan_status = 'infected') = (virus_signature IS NOT NULL)),
    CONSTRAINT ddm_attachment_scanned_has_time CHECK (
        (virus_scan_status = 'pending') = (scanned_at IS NULL))
);
CREATE INDEX ix_ddm_attachment_tenant ON mdm.ddm_attachment (tenant_id);
CREATE INDEX ix_ddm_attachment_pending ON mdm.ddm_attachment (committed_at)
    WHERE virus_scan_status = 'pending';
