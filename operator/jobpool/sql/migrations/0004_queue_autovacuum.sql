-- A queue table turns over: every job leaves dead tuples (claim, done, retention delete).
-- Vacuum and analyze it after a fixed number of changes, not a fraction of its size, so that
-- dead tuples stay bounded and the claim's statistics stay fresh whatever the backlog.
ALTER TABLE mdm.aa_job SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 1
);
ALTER TABLE mdm.aa_audit_log SET (
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000
);
