-- V6: where a halted partition's handler failed (the last frames of its traceback), and
-- the in-memory consumers each instance runs, published with its heartbeat (JSON).
ALTER TABLE {prefix}consumer_partitions ADD COLUMN halted_trace LONGTEXT NULL;
ALTER TABLE {prefix}instances ADD COLUMN in_memory LONGTEXT NULL;
