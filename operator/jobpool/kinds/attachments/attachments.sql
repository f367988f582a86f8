-- Attachments and their virus scan (kind virus_scan).

-- name: insert_attachment :one
-- A committed upload, pending its scan.
INSERT INTO mdm.ddm_attachment (tenant_id, file_name, content_type, size_bytes, storage_uri,
                                sha256)
VALUES (%(tenant_id)s, %(file_name)s, %(content_type)s, %(size_bytes)s, %(storage_uri)s,
        %(sha256)s)
RETURNING id, virus_scan_status::text AS virus_scan_status;

-- name: recommit_attachment :one
-- New content for an existing attachment of the tenant: pending again, earlier verdict cleared.
UPDATE mdm.ddm_attachment
   SET file_name = %(file_name)s, content_type = %(content_type)s, size_bytes = %(size_bytes)s,
       storage_uri = %(storage_uri)s, sha256 = %(sha256)s, virus_scan_status = 'pending',
       virus_signature = NULL, scan_detail = NULL, scanned_at = NULL, committed_at = now()
 WHERE id = %(id)s AND tenant_id = %(tenant_id)s
RETURNING id, virus_scan_status::text AS virus_scan_status;

-- name: attachment_to_scan :one
-- What the scan needs to know about an attachment.
SELECT id, tenant_id, storage_uri, size_bytes, sha256,
       virus_scan_status::text AS virus_scan_status
  FROM mdm.ddm_attachment
 WHERE id = %(id)s;

-- name: record_scan_result :one
-- Patch the verdict onto a still-pending attachment with the scanned content; audit it.
WITH scanned AS (
    UPDATE mdm.ddm_attachment
       SET virus_scan_status = %(status)s::mdm.virus_scan_status,
           virus_signature = %(signature)s, scan_detail = left(%(detail)s, 4000),
           scanned_at = now()
     WHERE id = %(id)s AND virus_scan_status = 'pending'
       AND sha256 = %(sha256)s AND storage_uri = %(storage_uri)s
    RETURNING id, tenant_id, virus_scan_status::text AS status, virus_signature
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, %(job_id)s, 'attachment_scanned',
           jsonb_build_object('attachment_id', id, 'status', status,
                              'signature', virus_signature)
      FROM scanned
)
SELECT count(*)::int AS changed FROM scanned;
