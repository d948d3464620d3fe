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

-- A message is its UUID on a topic; see the PostgreSQL migration. SQLite
-- cannot change a primary key in place: the table is rebuilt.
CREATE TABLE dbbus_messages_v2 (
    id         TEXT NOT NULL,
    topic      TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    payload    BLOB NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (id, topic)
);
INSERT INTO dbbus_messages_v2 (id, topic, metadata, payload, created_at)
SELECT id, topic, metadata, payload, created_at FROM dbbus_messages;
DROP TABLE dbbus_messages;
ALTER TABLE dbbus_messages_v2 RENAME TO dbbus_messages;

ALTER TABLE dbbus_deliveries ADD COLUMN topic TEXT NOT NULL DEFAULT '';
UPDATE dbbus_deliveries SET topic = (
    SELECT m.topic FROM dbbus_messages AS m WHERE m.id = dbbus_deliveries.message_id
) WHERE topic = '';
