-- V10: versions of a projection's read models (messaging.runtime._versions): the live
-- version's number (NULL: 1) and, while another version takes its place, what the live
-- version had applied when it stopped (JSON).
ALTER TABLE {prefix}consumers
    ADD COLUMN version INT NULL,
    ADD COLUMN cutover LONGTEXT NULL;
