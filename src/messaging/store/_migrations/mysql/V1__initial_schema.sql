-- V1: the framework's tables. {prefix} is replaced by the configured table prefix.
CREATE TABLE IF NOT EXISTS {prefix}positions (
    tenant VARCHAR(64) NOT NULL,
    last_position BIGINT NOT NULL,
    PRIMARY KEY (tenant)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}messages (
    tenant VARCHAR(64) NOT NULL,
    position BIGINT NOT NULL,
    topic VARCHAR(200) NOT NULL,
    source VARCHAR(200) NOT NULL,
    version INTEGER NOT NULL,
    type VARCHAR(200) NOT NULL,
    payload LONGTEXT NOT NULL,
    headers LONGTEXT NULL,
    partition_hash BIGINT NOT NULL,
    recorded_at DOUBLE NOT NULL,
    PRIMARY KEY (tenant, position),
    UNIQUE KEY {prefix}uq_source_version (tenant, topic, source, version),
    KEY {prefix}ix_messages_topic (tenant, topic, position)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}consumers (
    tenant VARCHAR(64) NOT NULL,
    name VARCHAR(200) NOT NULL,
    kind VARCHAR(32) NOT NULL,
    distribution VARCHAR(32) NOT NULL,
    partitions INTEGER NOT NULL,
    topics LONGTEXT NOT NULL,
    types LONGTEXT NOT NULL,
    fingerprint VARCHAR(64) NOT NULL,
    previous_fingerprint VARCHAR(64) NULL,
    state VARCHAR(32) NOT NULL,
    updated_at DOUBLE NOT NULL,
    PRIMARY KEY (tenant, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}consumer_partitions (
    tenant VARCHAR(64) NOT NULL,
    consumer VARCHAR(200) NOT NULL,
    partition_no INTEGER NOT NULL,
    owner VARCHAR(64) NULL,
    epoch BIGINT NOT NULL,
    checkpoint BIGINT NOT NULL,
    status VARCHAR(16) NOT NULL,
    halted_position BIGINT NULL,
    halted_type VARCHAR(200) NULL,
    error LONGTEXT NULL,
    halted_at DOUBLE NULL,
    updated_at DOUBLE NOT NULL,
    PRIMARY KEY (tenant, consumer, partition_no),
    KEY {prefix}ix_partitions_owner (tenant, owner)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}instances (
    tenant VARCHAR(64) NOT NULL,
    id VARCHAR(64) NOT NULL,
    name VARCHAR(200) NOT NULL,
    host VARCHAR(200) NOT NULL,
    pid INTEGER NOT NULL,
    started_at DOUBLE NOT NULL,
    heartbeat_at DOUBLE NOT NULL,
    stopping BOOL NOT NULL,
    runs LONGTEXT NOT NULL,
    PRIMARY KEY (tenant, id),
    KEY {prefix}ix_instances_heartbeat (tenant, heartbeat_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
