-- V3: the idempotency guard of route consumers, saga state and saga deadlines.
CREATE TABLE IF NOT EXISTS {prefix}processed_messages (
    tenant VARCHAR(64) NOT NULL,
    consumer VARCHAR(200) NOT NULL,
    message_id VARCHAR(200) NOT NULL,
    position BIGINT NOT NULL,
    processed_at DOUBLE NOT NULL,
    PRIMARY KEY (tenant, consumer, message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}sagas (
    tenant VARCHAR(64) NOT NULL,
    saga VARCHAR(200) NOT NULL,
    saga_key VARCHAR(200) NOT NULL,
    version INTEGER NOT NULL,
    state LONGTEXT NOT NULL,
    ended BOOL NOT NULL,
    started_at DOUBLE NOT NULL,
    updated_at DOUBLE NOT NULL,
    PRIMARY KEY (tenant, saga, saga_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}deadlines (
    tenant VARCHAR(64) NOT NULL,
    saga VARCHAR(200) NOT NULL,
    saga_key VARCHAR(200) NOT NULL,
    name VARCHAR(200) NOT NULL,
    partition_no INTEGER NOT NULL,
    due_at DOUBLE NOT NULL,
    type VARCHAR(200) NOT NULL,
    payload LONGTEXT NOT NULL,
    scheduled_at DOUBLE NOT NULL,
    PRIMARY KEY (tenant, saga, saga_key, name),
    KEY {prefix}ix_deadlines_due (tenant, saga, partition_no, due_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
