-- V7: a counter per tenant that joins, leaves, releases, stopping flags, pauses, resumes
-- and rebuilds bump in their own transactions; each instance reads it in its pulse.
CREATE TABLE IF NOT EXISTS {prefix}generations (
    tenant VARCHAR(64) NOT NULL,
    generation BIGINT NOT NULL,
    PRIMARY KEY (tenant)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
