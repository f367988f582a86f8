-- email_send's own bookkeeping: the tenant's suppression list and the log of mails sent.

-- name: suppress_address :exec
-- Add an address to a tenant's email suppression list.
INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)
VALUES (%(tenant_id)s, lower(%(address)s), %(reason)s)
ON CONFLICT (tenant_id, address) DO NOTHING;

-- name: suppressed_address :one
-- Whether the tenant suppresses mail to this address, given in each of its spellings
-- (Unicode and IDNA domain): the list stores lower-cased addresses as they were added.
SELECT reason FROM mdm.aa_email_suppression
 WHERE tenant_id = %(tenant_id)s
   AND address IN (SELECT lower(a) FROM unnest(%(addresses)s::text[]) AS a)
 LIMIT 1;

-- name: log_email :one
-- Record a sent or suppressed email once per provider message id; audit a send.
WITH logged AS (
    INSERT INTO mdm.aa_email_log (tenant_id, job_id, provider_message_id, recipient, subject, status)
    VALUES (%(tenant_id)s, %(job_id)s, %(message_id)s, %(recipient)s, %(subject)s, %(status)s)
    ON CONFLICT (provider_message_id) DO NOTHING
    RETURNING id, tenant_id, job_id, provider_message_id, status
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, job_id, 'email_sent',
           jsonb_build_object('message_id', provider_message_id)
      FROM logged WHERE status = 'sent'
)
SELECT count(*)::int AS logged FROM logged;
