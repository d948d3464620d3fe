-- The database bus; see the PostgreSQL migration. leased_until is in
-- milliseconds since the Unix epoch, by the database's clock.
CREATE TABLE IF NOT EXISTS dbbus_messages (
    id         TEXT PRIMARY KEY,
    topic      TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    payload    BLOB NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
);

CREATE TABLE IF NOT EXISTS dbbus_deliveries (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    group_name   TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    lease_token  TEXT,
    leased_until INTEGER
);

CREATE INDEX IF NOT EXISTS dbbus_deliveries_ready
    ON dbbus_deliveries (group_name, id) WHERE lease_token IS NULL;

CREATE INDEX IF NOT EXISTS dbbus_deliveries_leased
    ON dbbus_deliveries (group_name, leased_until) WHERE lease_token IS NOT NULL;

CREATE INDEX IF NOT EXISTS dbbus_deliveries_message ON dbbus_deliveries (message_id);

CREATE TABLE IF NOT EXISTS dbbus_bindings (
    group_name TEXT NOT NULL,
    pattern    TEXT NOT NULL,
    PRIMARY KEY (group_name, pattern)
);
