-- V4: the head position as of a consumer's last rebuild, so that reports show it REBUILDING,
-- with its progress, until it has caught up to that position.
ALTER TABLE {prefix}consumers ADD COLUMN rebuild_target BIGINT NULL;
