-- V8: the MySQL sessions of each instance (server, server start, CONNECTION_ID(), as
-- JSON), so that the instance taking over from a stale one can end its sessions.
ALTER TABLE {prefix}instances ADD COLUMN sessions LONGTEXT NULL;
