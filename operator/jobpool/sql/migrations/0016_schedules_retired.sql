-- `jobpool schedules retire`: the schedules of a pool that is gone, deleted by a person, audited.
ALTER TYPE mdm.audit_action ADD VALUE IF NOT EXISTS 'schedules_retired';
