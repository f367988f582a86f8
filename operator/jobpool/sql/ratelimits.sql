-- Named queries of rate limits.

-- name: tenant_rate_limits :many
-- Every tenant's key and its rate_limit metadata as JSON text (NULL when it sets none).
SELECT id, key, (metadata -> 'rate_limit')::text AS rate_limit
  FROM mdm.aa_tenant
 ORDER BY key;

-- name: lease_tokens :many
-- Take wants[i] tokens from bucket keys[i] (created full), refilled at its rps since its last lease; returns each bucket's balance after (negative: tokens owed).
INSERT INTO mdm.aa_rate_bucket AS b (key, rps, burst, tokens, taken, updated_at)
SELECT w.key, w.rps, w.burst, w.burst - w.want, w.want, clock_timestamp()
  FROM unnest(%(keys)s::text[], %(rps)s::float8[], %(bursts)s::int[], %(wants)s::int[])
       AS w(key, rps, burst, want)
 ORDER BY w.key
    ON CONFLICT (key) DO UPDATE
   SET tokens = least(excluded.burst::float8,
                      b.tokens + b.rps * greatest(0.0, extract(epoch FROM excluded.updated_at
                                                                      - b.updated_at)::float8))
                - excluded.taken,
       taken = excluded.taken,
       rps = excluded.rps,
       burst = excluded.burst,
       updated_at = greatest(b.updated_at, excluded.updated_at)
RETURNING key, tokens, taken;
