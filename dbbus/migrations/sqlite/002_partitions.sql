-- Partitioned groups and queue owners; see the PostgreSQL migration.
-- leased_until is in milliseconds since the Unix epoch, by the database's
-- clock.
CREATE TABLE IF NOT EXISTS dbbus_partitions (
    group_name TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS dbbus_queue_owners (
    queue        TEXT PRIMARY KEY,
    owner        TEXT NOT NULL,
    leased_until INTEGER NOT NULL
);
