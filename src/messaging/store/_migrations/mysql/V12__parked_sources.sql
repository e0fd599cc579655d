-- V12: a failing message parks its source (``on-failure: park-source``): one row per
-- parked source of a consumer (its messages from ``position`` on are held back, in
-- order), and the messages operators skipped (recorded, applied only by a retry).
CREATE TABLE IF NOT EXISTS {prefix}parked_sources (
    tenant VARCHAR(64) NOT NULL,
    consumer VARCHAR(200) NOT NULL,
    source VARCHAR(200) NOT NULL,
    partition_no INTEGER NOT NULL,
    position BIGINT NOT NULL,
    type VARCHAR(200) NOT NULL,
    error LONGTEXT NULL,
    trace LONGTEXT NULL,
    parked_at DOUBLE NOT NULL,
    state VARCHAR(16) NOT NULL,
    PRIMARY KEY (tenant, consumer, source),
    KEY {prefix}ix_parked_partition (tenant, consumer, partition_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}skipped_messages (
    tenant VARCHAR(64) NOT NULL,
    consumer VARCHAR(200) NOT NULL,
    position BIGINT NOT NULL,
    source VARCHAR(200) NOT NULL,
    partition_no INTEGER NOT NULL,
    type VARCHAR(200) NOT NULL,
    error LONGTEXT NULL,
    skipped_at DOUBLE NOT NULL,
    who VARCHAR(200) NOT NULL,
    PRIMARY KEY (tenant, consumer, position),
    KEY {prefix}ix_skipped_source (tenant, consumer, source)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
