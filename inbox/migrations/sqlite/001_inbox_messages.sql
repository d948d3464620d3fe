-- The inbox: one row per (consumer, message) applied. The primary key is the
-- dedup: a second delivery's insert conflicts and the handler is skipped.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer    TEXT     NOT NULL,
    message_id  TEXT     NOT NULL,
    tenant_id   TEXT     NOT NULL DEFAULT 'default',
    received_at DATETIME NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS inbox_messages_received ON inbox_messages (received_at);
