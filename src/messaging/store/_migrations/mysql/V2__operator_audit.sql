-- V2: who paused, resumed or rebuilt which consumer, when and why; and every declaration a
-- consumer has left behind, so that instances still running one apply nothing.
CREATE TABLE IF NOT EXISTS {prefix}audit (
    id INTEGER NOT NULL AUTO_INCREMENT,
    tenant VARCHAR(64) NOT NULL,
    at DOUBLE NOT NULL,
    who VARCHAR(200) NOT NULL,
    command VARCHAR(32) NOT NULL,
    consumer VARCHAR(200) NOT NULL,
    detail LONGTEXT NULL,
    PRIMARY KEY (id),
    KEY {prefix}ix_audit_consumer (tenant, consumer, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE {prefix}consumers ADD COLUMN retired_fingerprints LONGTEXT NULL;
