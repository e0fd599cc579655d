-- V11: the liveness signal each instance holds for its lifetime (a named lock on its
-- server, or a locked file on its host, as JSON), or why it was declared gone: peers that
-- can see the signal take a crashed process's partitions over at once.
ALTER TABLE {prefix}instances ADD COLUMN liveness LONGTEXT NULL;
