-- Tenants: look-up, creation, list.

-- name: resolve_tenant :one
-- A tenant by key or by id (one of the two is null).
SELECT id, key FROM mdm.aa_tenant WHERE key = %(key)s::text OR id = %(id)s::uuid;

-- name: create_tenant :one
-- Add a tenant; an existing key keeps its row and gets the given metadata merged in.
INSERT INTO mdm.aa_tenant (key, metadata) VALUES (%(key)s, %(metadata)s::jsonb)
ON CONFLICT (key) DO UPDATE SET metadata = aa_tenant.metadata || EXCLUDED.metadata
RETURNING id, key;

-- name: list_tenants :many
-- Every tenant.
SELECT id, key, metadata FROM mdm.aa_tenant ORDER BY key;

-- name: tenant_keys :many
-- Every tenant's key (what an unknown tenant's "did you mean" is chosen from).
SELECT key FROM mdm.aa_tenant ORDER BY key;
