-- email_send's own bookkeeping: the tenant's suppression list.

-- name: suppress_address :exec
-- Add an address to a tenant's email suppression list.
INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)
VALUES (%(tenant_id)s, lower(%(address)s), %(reason)s)
ON CONFLICT (tenant_id, address) DO NOTHING;
