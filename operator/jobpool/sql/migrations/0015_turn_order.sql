-- The claim asks whether a served tenant's turn is already the newest of all (then a claim
-- that served that tenant alone leaves its turn row as it is): one descent of this index
-- instead of a scan of every tenant's turn. The table holds a row per tenant ever served.
CREATE INDEX IF NOT EXISTS ix_aa_tenant_turn_at ON mdm.aa_tenant_turn (turn_at);
