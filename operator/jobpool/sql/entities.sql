-- The data kinds' named queries (bulk_import, reindex, index_sync, gin_backfill).
-- Parameters are psycopg's %(name)s placeholders. Queries holding {braces} are templates for
-- psycopg.sql.SQL(...).format(): {index} and {function} are sql.Identifier, the others
-- sql.Literal; type_key/attr_key are validated (jobpool.core.attributes.KEY_PATTERN) first.

-- name: entity_type_by_key :one
-- One entity type of a tenant by its key.
SELECT id, tenant_id, type_key, is_external_source_target, gin_index_status::text AS gin_index_status
  FROM mdm.ddm_entity_type
 WHERE tenant_id = %(tenant_id)s AND type_key = %(type_key)s;

-- name: entity_type_attributes :many
-- The attributes of an entity type, in key order.
SELECT id, attr_key, data_type::text AS data_type, required, enum_values, is_unique,
       searchable, sortable, index_status::text AS index_status
  FROM mdm.ddm_entity_type_attribute
 WHERE entity_type_id = %(entity_type_id)s
 ORDER BY attr_key;

-- name: attribute_by_id :one
-- One attribute with its type's tenant and key.
SELECT a.id, a.entity_type_id, a.attr_key, a.data_type::text AS data_type, a.is_unique,
       a.searchable, a.sortable, a.index_status::text AS index_status,
       t.tenant_id, t.type_key
  FROM mdm.ddm_entity_type_attribute a JOIN mdm.ddm_entity_type t ON t.id = a.entity_type_id
 WHERE a.id = %(id)s;

-- name: create_import_job :one
-- Create a staged import of one file for an entity type.
INSERT INTO mdm.aa_import_job (tenant_id, entity_type_id, source_name, format, key_field,
                               unknown_keys, created_by)
VALUES (%(tenant_id)s, %(entity_type_id)s, %(source_name)s, %(format)s, %(key_field)s,
        %(unknown_keys)s, %(created_by)s)
RETURNING id;

-- name: copy_import_rows :exec
-- COPY staged records (import_job_id, line_no, raw, status, error_field, error) in.
COPY mdm.aa_import_row (import_job_id, line_no, raw, status, error_field, error) FROM STDIN;

-- name: set_import_total :exec
-- Record how many records an import staged.
UPDATE mdm.aa_import_job
   SET total_rows = (SELECT count(*) FROM mdm.aa_import_row WHERE import_job_id = %(id)s)
 WHERE id = %(id)s;

-- name: import_job_for_run :one
-- An import job of this tenant with its entity type's key.
SELECT i.id, i.tenant_id, i.entity_type_id, t.type_key, i.key_field, i.unknown_keys,
       i.status::text AS status, i.total_rows, i.last_line, i.inserted, i.updated,
       i.unchanged, i.rejected
  FROM mdm.aa_import_job i JOIN mdm.ddm_entity_type t ON t.id = i.entity_type_id
 WHERE i.id = %(id)s AND i.tenant_id = %(tenant_id)s;

-- name: lock_import_progress :one
-- Lock an import's progress marker for one batch, if the job still holds its claim.
SELECT i.last_line, i.status::text AS status
  FROM mdm.aa_import_job i
 WHERE i.id = %(id)s
   AND EXISTS (SELECT 1 FROM mdm.aa_job j
                WHERE j.id = %(job_id)s AND j.status = 'running'
                  AND j.claimed_by = %(claimed_by)s AND j.attempts = %(attempts)s)
   FOR UPDATE OF i;

-- name: next_import_rows :many
-- The next staged records after the progress marker, in line order: at most `limit` rows,
-- and none after `max_chars` characters of raw text (the first row always comes).
SELECT line_no, raw, status, error_field, error
  FROM (SELECT line_no, raw, status::text AS status, error_field, error,
               sum(length(raw)) OVER (ORDER BY line_no) - length(raw) AS chars_before
          FROM mdm.aa_import_row
         WHERE import_job_id = %(id)s AND line_no > %(after)s
         ORDER BY line_no
         LIMIT %(limit)s) AS batch
 WHERE chars_before < %(max_chars)s
 ORDER BY line_no;

-- name: upsert_entities :many
-- Insert or update entities by external key; unchanged rows are left alone (not returned).
INSERT INTO mdm.ddm_entity AS e (tenant_id, entity_type_id, external_key, attributes,
                                 search_vector)
SELECT %(tenant_id)s, %(entity_type_id)s, r.external_key, r.attributes,
       mdm.entity_search_vector(r.attributes, %(search_keys)s::text[])
  FROM unnest(%(external_keys)s::text[], %(attributes)s::jsonb[]) AS r(external_key, attributes)
ON CONFLICT (tenant_id, entity_type_id, external_key) DO UPDATE
   SET attributes = EXCLUDED.attributes, search_vector = EXCLUDED.search_vector,
       updated_at = now()
 WHERE e.attributes IS DISTINCT FROM EXCLUDED.attributes
    OR e.search_vector IS DISTINCT FROM EXCLUDED.search_vector
RETURNING e.external_key, (e.xmax = 0) AS inserted;

-- name: mark_import_rows :exec
-- Record each processed record's outcome.
UPDATE mdm.aa_import_row r
   SET status = o.status::mdm.import_row_status, error_field = o.error_field, error = o.error
  FROM unnest(%(line_nos)s::int[], %(statuses)s::text[], %(error_fields)s::text[],
              %(errors)s::text[]) AS o(line_no, status, error_field, error)
 WHERE r.import_job_id = %(id)s AND r.line_no = o.line_no;

-- name: advance_import :exec
-- Move the progress marker past a committed batch and add its counts.
UPDATE mdm.aa_import_job
   SET last_line = %(last_line)s, status = 'running', started_at = coalesce(started_at, now()),
       inserted = inserted + %(inserted)s, updated = updated + %(updated)s,
       unchanged = unchanged + %(unchanged)s, rejected = rejected + %(rejected)s
 WHERE id = %(id)s;

-- name: finish_import :one
-- Mark an import done, audit it, and return its counts.
WITH done AS (
    UPDATE mdm.aa_import_job
       SET status = 'done', completed_at = coalesce(completed_at, now())
     WHERE id = %(id)s
    RETURNING id, tenant_id, total_rows, inserted, updated, unchanged, rejected
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, %(job_id)s, 'import_completed',
           jsonb_build_object('import_job_id', id, 'inserted', inserted, 'updated', updated,
                              'unchanged', unchanged, 'rejected', rejected)
      FROM done
)
SELECT id, total_rows, inserted, updated, unchanged, rejected FROM done;

-- name: rejected_import_rows :many
-- The rejected records of an import, in line order.
SELECT line_no, error_field, error
  FROM mdm.aa_import_row
 WHERE import_job_id = %(id)s AND status = 'rejected'
 ORDER BY line_no;

-- name: reindex_batch :one
-- Recompute search_vector for the next batch of a type's entities after an id (short locks).
WITH batch AS (
    SELECT id
      FROM mdm.ddm_entity
     WHERE entity_type_id = %(entity_type_id)s AND id > %(after)s
     ORDER BY id
     LIMIT %(limit)s
), changed AS (
    UPDATE mdm.ddm_entity e
       SET search_vector = mdm.entity_search_vector(e.attributes, %(search_keys)s::text[])
      FROM batch
     WHERE e.id = batch.id
       AND e.search_vector IS DISTINCT FROM
           mdm.entity_search_vector(e.attributes, %(search_keys)s::text[])
    RETURNING e.id
)
SELECT (SELECT max(id) FROM batch) AS last_id, (SELECT count(*) FROM batch)::int AS scanned,
       (SELECT count(*) FROM changed)::int AS updated;

-- name: audit_data_job :exec
-- Audit a data kind's outcome (reindex, index builds) in the job's transaction.
INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
VALUES (%(actor)s, %(tenant_id)s, %(job_id)s, %(action)s::mdm.audit_action, %(payload)s::jsonb);

-- name: set_build_timeouts :exec
-- Session timeouts of an index build connection, in milliseconds.
SELECT set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('statement_timeout', %(statement_timeout)s, false);

-- name: try_lock_entity_index_builds :one
-- Try to take the lock that serialises index DDL on mdm.ddm_entity (session advisory lock).
SELECT pg_try_advisory_lock(hashtextextended('jobpool.index-ddl:mdm.ddm_entity', 0)) AS locked;

-- name: unlock_entity_index_builds :exec
-- Release the lock taken by lock_entity_index_builds.
SELECT pg_advisory_unlock(hashtextextended('jobpool.index-ddl:mdm.ddm_entity', 0));

-- name: analyze_entities :exec
-- Refresh mdm.ddm_entity's statistics (index expressions included) so EXPLAIN is representative.
ANALYZE mdm.ddm_entity;

-- name: transaction_footprint :one
-- Whether a backend holds a snapshot, or any lock on mdm.ddm_entity (either blocks a build).
SELECT a.backend_xmin IS NOT NULL AS has_snapshot,
       EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.pid = a.pid AND l.relation = 'mdm.ddm_entity'::regclass) AS locks_table
  FROM pg_stat_activity a
 WHERE a.pid = %(pid)s;

-- name: inspect_index :one
-- An index in schema mdm by name: on which table, valid, ready, unique, and its comment.
SELECT c.oid::bigint AS oid, t.relname AS table_name, i.indisvalid AS valid,
       i.indisready AS ready, i.indisunique AS is_unique,
       obj_description(c.oid, 'pg_class') AS comment
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_index i ON i.indexrelid = c.oid
  JOIN pg_class t ON t.oid = i.indrelid
 WHERE n.nspname = 'mdm' AND c.relname = %(name)s;

-- name: set_attribute_index_status :exec
-- Record an attribute's index status (and error), unless its flags changed since they were read.
UPDATE mdm.ddm_entity_type_attribute
   SET index_status = %(status)s::mdm.index_status, index_error = %(error)s
 WHERE id = %(id)s
   AND (searchable, sortable, is_unique) = (%(searchable)s, %(sortable)s, %(is_unique)s);

-- name: set_gin_index_status :exec
-- Record an entity type's GIN index status (and error) after gin_backfill.
UPDATE mdm.ddm_entity_type
   SET gin_index_status = %(status)s::mdm.index_status, gin_index_error = %(error)s
 WHERE id = %(id)s AND is_external_source_target;

-- name: drop_index_concurrently :exec
-- Drop an index online (outside any transaction).
DROP INDEX CONCURRENTLY IF EXISTS {index};

-- name: comment_index :exec
-- Stamp an index with the signature of its definition (the drift check compares it).
COMMENT ON INDEX {index} IS {signature};

-- name: create_attribute_index :exec
-- Build an attribute's expression index online, partial on its entity type.
CREATE INDEX CONCURRENTLY {index} ON mdm.ddm_entity ({function}(attributes, {attr_key}))
 WHERE entity_type_id = {entity_type_id};

-- name: create_unique_attribute_index :exec
-- Build a unique attribute's expression index online, partial on its entity type.
CREATE UNIQUE INDEX CONCURRENTLY {index}
    ON mdm.ddm_entity ({function}(attributes, {attr_key}))
 WHERE entity_type_id = {entity_type_id};

-- name: create_gin_index :exec
-- Build a type's GIN index on attributes (jsonb_path_ops) online, partial on the type.
CREATE INDEX CONCURRENTLY {index} ON mdm.ddm_entity USING gin (attributes jsonb_path_ops)
 WHERE entity_type_id = {entity_type_id};

-- name: explain_attribute_sort :one
-- Plan of a sortable attribute's canonical query: a type's entities ordered by the attribute.
EXPLAIN (FORMAT JSON)
SELECT id FROM mdm.ddm_entity
 WHERE entity_type_id = {entity_type_id}
 ORDER BY {function}(attributes, {attr_key})
 LIMIT 50;

-- name: explain_attribute_equality :one
-- Plan of a searchable attribute's canonical query: a type's entities with a given value.
EXPLAIN (FORMAT JSON)
SELECT id FROM mdm.ddm_entity
 WHERE entity_type_id = {entity_type_id}
   AND {function}(attributes, {attr_key}) = {function}({sample}::jsonb, {attr_key});

-- name: explain_containment :one
-- Plan of the GIN index's canonical query: a type's entities containing a JSON fragment.
EXPLAIN (FORMAT JSON)
SELECT id FROM mdm.ddm_entity
 WHERE entity_type_id = {entity_type_id} AND attributes @> {sample}::jsonb;

-- name: planner_prefers_indexes :exec
-- Make EXPLAIN show whether an index can serve a query, whatever the table's size.
SELECT set_config('enable_seqscan', %(off)s, false);
