-- reindex, index_sync and gin_backfill: search vectors and online index builds.
-- Parameters are psycopg's %(name)s placeholders. Queries holding {braces} are templates for
-- psycopg.sql.SQL(...).format(): {index} and {function} are sql.Identifier, the others
-- sql.Literal; type_key/attr_key are validated (jobpool.kinds.entities.attributes.KEY_PATTERN)
-- first.

-- name: attribute_by_id :one
-- One attribute with its type's tenant and key.
SELECT a.id, a.entity_type_id, a.attr_key, a.data_type::text AS data_type, a.is_unique,
       a.searchable, a.sortable, a.index_status::text AS index_status,
       t.tenant_id, t.type_key
  FROM mdm.ddm_entity_type_attribute a JOIN mdm.ddm_entity_type t ON t.id = a.entity_type_id
 WHERE a.id = %(id)s;

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
