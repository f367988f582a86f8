-- Paused work: a row per paused scope, a (tenant, kind) pair, a kind for every tenant
-- (tenant_id NULL) or a tenant for every kind (job_kind NULL). The claim leaves the ready
-- jobs of a paused scope where they are (no attempt used) and the scaler does not count them;
-- running jobs finish. Resuming deletes the row. Both are audited.
CREATE TABLE IF NOT EXISTS mdm.aa_pause (
    tenant_id uuid REFERENCES mdm.aa_tenant (id) ON DELETE CASCADE,
    job_kind  text REFERENCES mdm.aa_job_kind (name) ON DELETE CASCADE,
    paused_by text NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    reason    text CHECK (length(reason) <= 500),
    CONSTRAINT aa_pause_has_scope CHECK (tenant_id IS NOT NULL OR job_kind IS NOT NULL)
);
-- One row per scope (NULL standing for "every"), and the claim's look-ups of a head's
-- (tenant, kind), (tenant, every kind) and (every tenant, kind) rows.
CREATE UNIQUE INDEX IF NOT EXISTS ux_aa_pause_scope
    ON mdm.aa_pause ((coalesce(tenant_id::text, '')), (coalesce(job_kind, '')));
CREATE INDEX IF NOT EXISTS ix_aa_pause_lookup ON mdm.aa_pause (tenant_id, job_kind);
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'work_paused';
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'work_resumed';
