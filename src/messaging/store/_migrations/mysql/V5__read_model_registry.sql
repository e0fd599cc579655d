-- V5: which tenant owns each physical read-model table, so that a configuration under
-- which two tenants would write one table is refused at start. Not scoped by tenant: it
-- is the one table that compares tenants. The key is the name in lower case (MySQL
-- table names are case-insensitive on some file systems).
CREATE TABLE IF NOT EXISTS {prefix}read_models (
    table_key VARCHAR(64) NOT NULL,
    table_name VARCHAR(64) NOT NULL,
    tenant VARCHAR(64) NOT NULL,
    consumer VARCHAR(200) NOT NULL,
    registered_at DOUBLE NOT NULL,
    PRIMARY KEY (table_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
