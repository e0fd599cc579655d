-- V9: the id of the operator command an audit entry records, in its own indexed column:
-- the retry of a command whose commit was not acknowledged looks it up by equality.
-- Entries written before keep their id inside ``detail`` (the column is NULL for them).
ALTER TABLE {prefix}audit
    ADD COLUMN command_id VARCHAR(32) NULL,
    ADD KEY {prefix}ix_audit_command (tenant, command_id);
