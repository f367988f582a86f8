-- Named queries of rate limits.

-- name: tenant_rate_limits :many
-- Every tenant's key and its rate_limit metadata as JSON text (NULL when it sets none).
SELECT id, key, (metadata -> 'rate_limit')::text AS rate_limit
  FROM mdm.aa_tenant
 ORDER BY key;
