-- V13: the version of every stored payload's shape (messaging._upcasting): written from
-- the message class's declared version; rows stored before are version 1. The index
-- lets `projections messages check` list the distinct (topic, type, version) without
-- reading the rows. A partition whose next message is of a version newer than its
-- owner's code records what it needs (JSON), and waits for an instance that has it. A
-- saga's stored state has a version too (states stored before are version 1), and so
-- does a deadline's payload.
ALTER TABLE {prefix}messages
    ADD COLUMN payload_version INT NOT NULL DEFAULT 1,
    ADD INDEX {prefix}ix_messages_shape (tenant, topic, type, payload_version);
ALTER TABLE {prefix}consumer_partitions ADD COLUMN needs LONGTEXT NULL;
ALTER TABLE {prefix}sagas ADD COLUMN state_version INT NOT NULL DEFAULT 1;
ALTER TABLE {prefix}deadlines ADD COLUMN payload_version INT NOT NULL DEFAULT 1;
