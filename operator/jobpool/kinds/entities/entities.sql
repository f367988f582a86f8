-- Entity types and their attributes, read by the imports and indexes slices.
-- Parameters are psycopg's %(name)s placeholders.

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
