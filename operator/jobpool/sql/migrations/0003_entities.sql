-- Master data: entity types, their attributes, entities, import staging; the data kinds'
-- job kinds, audit actions, and the triggers that enqueue index_sync / gin_backfill / reindex
-- in the same transaction as the change.

ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'import_completed';
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'search_reindexed';
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'index_built';
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'index_dropped';

-- The four kinds exist before any worker registers them, so triggers can enqueue at once.
-- Superseded by registration: `jobpool migrate` registers every built-in kind with the
-- defaults its declaration carries (jobpool.kinds), right after the migrations, and so does
-- each worker for its kinds. These rows only seed the kinds until then.
INSERT INTO mdm.aa_job_kind (name, priority, max_attempts, stale_ttl) VALUES
    ('bulk_import', 100, 20, interval '1 hour'),
    ('reindex', 150, 20, interval '1 hour'),
    ('index_sync', 200, 3, interval '2 hours'),
    ('gin_backfill', 200, 3, interval '2 hours')
ON CONFLICT (name) DO NOTHING;

CREATE TYPE mdm.attribute_data_type AS ENUM (
    'string', 'integer', 'number', 'boolean', 'date', 'timestamp', 'enum');
CREATE TYPE mdm.index_status AS ENUM ('building', 'active', 'failed', 'dropped');
CREATE TYPE mdm.import_status AS ENUM ('staged', 'running', 'done');
CREATE TYPE mdm.import_row_status AS ENUM ('staged', 'imported', 'rejected');

-- type_key and attr_key become parts of index names: the pattern is the one
-- jobpool.core.attributes.KEY_PATTERN enforces before any SQL runs.
CREATE TABLE mdm.ddm_entity_type (
    id                        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id                 uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    type_key                  text NOT NULL CHECK (type_key ~ '^[a-z][a-z0-9_]{0,39}$'),
    is_external_source_target boolean NOT NULL DEFAULT false,
    gin_index_status          mdm.index_status,
    gin_index_error           text,
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, type_key),
    UNIQUE (id, tenant_id)
);

CREATE TABLE mdm.ddm_entity_type_attribute (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_type_id bigint NOT NULL REFERENCES mdm.ddm_entity_type (id) ON DELETE CASCADE,
    attr_key       text NOT NULL CHECK (attr_key ~ '^[a-z][a-z0-9_]{0,39}$'),
    data_type      mdm.attribute_data_type NOT NULL,
    required       boolean NOT NULL DEFAULT false,
    enum_values    text[] CHECK (enum_values IS NULL OR cardinality(enum_values) > 0),
    is_unique      boolean NOT NULL DEFAULT false,
    searchable     boolean NOT NULL DEFAULT false,
    sortable       boolean NOT NULL DEFAULT false,
    index_status   mdm.index_status,
    index_error    text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (entity_type_id, attr_key),
    CONSTRAINT ddm_attribute_enum_has_values CHECK (
        (data_type = 'enum') = (enum_values IS NOT NULL))
);

CREATE TABLE mdm.ddm_entity (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      uuid NOT NULL,
    entity_type_id bigint NOT NULL,
    external_key   text NOT NULL CHECK (length(external_key) BETWEEN 1 AND 255),
    attributes     jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(attributes) = 'object'),
    search_vector  tsvector,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (entity_type_id, tenant_id) REFERENCES mdm.ddm_entity_type (id, tenant_id),
    UNIQUE (tenant_id, entity_type_id, external_key)
);
CREATE INDEX ix_ddm_entity_type_id ON mdm.ddm_entity (entity_type_id, id);
CREATE INDEX ix_ddm_entity_search ON mdm.ddm_entity USING gin (search_vector);

-- Typed read of one attribute. Index expressions and queries use these, so that an
-- attribute index serves the canonical query; dates and timestamps are stored as canonical
-- ISO text of fixed width (UTC for timestamps), which sorts in time order.
CREATE FUNCTION mdm.attr_text(attributes jsonb, attr_key text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN attributes ->> attr_key;
CREATE FUNCTION mdm.attr_bigint(attributes jsonb, attr_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (attributes ->> attr_key)::bigint;
CREATE FUNCTION mdm.attr_numeric(attributes jsonb, attr_key text) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (attributes ->> attr_key)::numeric;
CREATE FUNCTION mdm.attr_boolean(attributes jsonb, attr_key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (attributes ->> attr_key)::boolean;

-- The text the search vector is built from: the given attributes' values, in key order.
CREATE FUNCTION mdm.entity_search_vector(attributes jsonb, search_keys text[]) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN to_tsvector('simple'::regconfig, coalesce(
        (SELECT string_agg(attributes ->> k, ' ' ORDER BY o)
           FROM unnest(search_keys) WITH ORDINALITY AS u(k, o)), ''));

-- Import staging: one aa_import_job per uploaded file, one aa_import_row per record.
-- last_line is the progress marker: every row up to it is committed (imported or rejected),
-- written in the same transaction as that batch's entities.
CREATE TABLE mdm.aa_import_job (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      uuid NOT NULL REFERENCES mdm.aa_tenant (id),
    entity_type_id bigint NOT NULL REFERENCES mdm.ddm_entity_type (id),
    source_name    text NOT NULL,
    format         text NOT NULL CHECK (format IN ('csv', 'jsonl')),
    key_field      text NOT NULL DEFAULT 'external_key',
    unknown_keys   text NOT NULL DEFAULT 'reject' CHECK (unknown_keys IN ('reject', 'ignore')),
    status         mdm.import_status NOT NULL DEFAULT 'staged',
    total_rows     integer NOT NULL DEFAULT 0 CHECK (total_rows >= 0),
    last_line      integer NOT NULL DEFAULT 0,
    inserted       integer NOT NULL DEFAULT 0,
    updated        integer NOT NULL DEFAULT 0,
    unchanged      integer NOT NULL DEFAULT 0,
    rejected       integer NOT NULL DEFAULT 0,
    created_by     text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    completed_at   timestamptz
);

CREATE TABLE mdm.aa_import_row (
    import_job_id bigint NOT NULL REFERENCES mdm.aa_import_job (id) ON DELETE CASCADE,
    line_no       integer NOT NULL CHECK (line_no >= 1),
    raw           text NOT NULL,
    status        mdm.import_row_status NOT NULL DEFAULT 'staged',
    error_field   text,
    error         text,
    PRIMARY KEY (import_job_id, line_no)
);
CREATE INDEX ix_aa_import_row_rejected ON mdm.aa_import_row (import_job_id, line_no)
    WHERE status = 'rejected';

-- Enqueue from a trigger: what the enqueue_jobs query does (kind defaults, audit
-- job_enqueued, NOTIFY at commit). dedupe_in_tx: skip when this transaction already
-- enqueued a pending job of the kind whose payload contains the given one.
CREATE FUNCTION mdm.enqueue_job_from_trigger(
    p_tenant_id uuid, p_kind text, p_payload jsonb, p_dedupe_in_tx jsonb DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_dedupe_in_tx IS NOT NULL THEN
        SELECT id INTO v_id
          FROM mdm.aa_job
         WHERE tenant_id = p_tenant_id AND job_kind = p_kind AND status = 'pending'
           AND payload @> p_dedupe_in_tx AND xmin = pg_current_xact_id()::xid
         LIMIT 1;
        IF FOUND THEN
            RETURN v_id;
        END IF;
    END IF;
    INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, max_attempts)
    SELECT p_tenant_id, k.name, p_payload, k.priority, k.max_attempts
      FROM mdm.aa_job_kind k
     WHERE k.name = p_kind
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'job kind % is not registered in mdm.aa_job_kind', p_kind
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    VALUES (coalesce(nullif(current_setting('jobpool.actor', true), ''), current_user),
            p_tenant_id, v_id, 'job_enqueued', jsonb_build_object('kind', p_kind));
    PERFORM pg_notify('jobpool', p_kind);
    RETURN v_id;
END
$$;

-- A change to searchable/sortable/is_unique puts the attribute's index into 'building'.
CREATE FUNCTION mdm.ddm_attribute_index_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.searchable OR NEW.sortable THEN
            NEW.index_status := 'building';
            NEW.index_error := NULL;
        END IF;
    ELSIF (NEW.searchable, NEW.sortable, NEW.is_unique)
          IS DISTINCT FROM (OLD.searchable, OLD.sortable, OLD.is_unique) THEN
        NEW.index_status := 'building';
        NEW.index_error := NULL;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER ddm_attribute_index_pending
    BEFORE INSERT OR UPDATE OF searchable, sortable, is_unique
    ON mdm.ddm_entity_type_attribute
    FOR EACH ROW EXECUTE FUNCTION mdm.ddm_attribute_index_pending();

-- ... and enqueues index_sync (one per attribute change) and reindex (once per transaction
-- and type) in the same transaction.
CREATE FUNCTION mdm.ddm_attribute_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_row mdm.ddm_entity_type_attribute;
    v_type mdm.ddm_entity_type;
    v_index_change boolean;
    v_search_change boolean;
BEGIN
    IF TG_OP = 'DELETE' THEN
        v_row := OLD;
        v_index_change := OLD.index_status IS DISTINCT FROM 'dropped'
                          AND OLD.index_status IS NOT NULL;
        v_search_change := OLD.searchable;
    ELSIF TG_OP = 'INSERT' THEN
        v_row := NEW;
        v_index_change := NEW.searchable OR NEW.sortable;
        v_search_change := NEW.searchable;
    ELSE
        v_row := NEW;
        v_index_change := (NEW.searchable, NEW.sortable, NEW.is_unique)
                          IS DISTINCT FROM (OLD.searchable, OLD.sortable, OLD.is_unique);
        v_search_change := NEW.searchable IS DISTINCT FROM OLD.searchable;
    END IF;
    SELECT * INTO v_type FROM mdm.ddm_entity_type WHERE id = v_row.entity_type_id;
    IF NOT FOUND THEN
        RETURN NULL;  -- the type itself is being deleted: its entities (and indexes) must go first
    END IF;
    IF v_index_change THEN
        PERFORM mdm.enqueue_job_from_trigger(v_type.tenant_id, 'index_sync', jsonb_build_object(
            'attribute_id', v_row.id, 'entity_type_id', v_type.id,
            'type_key', v_type.type_key, 'attr_key', v_row.attr_key));
    END IF;
    IF v_search_change THEN
        PERFORM mdm.enqueue_job_from_trigger(v_type.tenant_id, 'reindex',
            jsonb_build_object('type_key', v_type.type_key),
            jsonb_build_object('type_key', v_type.type_key));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER ddm_attribute_enqueue
    AFTER INSERT OR DELETE OR UPDATE OF searchable, sortable, is_unique
    ON mdm.ddm_entity_type_attribute
    FOR EACH ROW EXECUTE FUNCTION mdm.ddm_attribute_enqueue();

-- Setting is_external_source_target to true enqueues gin_backfill in the same transaction.
CREATE FUNCTION mdm.ddm_entity_type_gin_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.is_external_source_target
       AND (TG_OP = 'INSERT' OR NOT OLD.is_external_source_target) THEN
        NEW.gin_index_status := 'building';
        NEW.gin_index_error := NULL;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER ddm_entity_type_gin_pending
    BEFORE INSERT OR UPDATE OF is_external_source_target ON mdm.ddm_entity_type
    FOR EACH ROW EXECUTE FUNCTION mdm.ddm_entity_type_gin_pending();

CREATE FUNCTION mdm.ddm_entity_type_gin_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.is_external_source_target
       AND (TG_OP = 'INSERT' OR NOT OLD.is_external_source_target) THEN
        PERFORM mdm.enqueue_job_from_trigger(NEW.tenant_id, 'gin_backfill', jsonb_build_object(
            'entity_type_id', NEW.id, 'type_key', NEW.type_key));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER ddm_entity_type_gin_enqueue
    AFTER INSERT OR UPDATE OF is_external_source_target ON mdm.ddm_entity_type
    FOR EACH ROW EXECUTE FUNCTION mdm.ddm_entity_type_gin_enqueue();
