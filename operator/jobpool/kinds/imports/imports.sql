-- bulk_import and `jobpool import`: staging, batches, progress.
-- Parameters are psycopg's %(name)s placeholders.

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
