-- The inbox: one row per (consumer, message) applied. The primary key is the
-- dedup: a second delivery's insert conflicts and the handler is skipped.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer    VARCHAR(200) NOT NULL,
    message_id  VARCHAR(128) NOT NULL,
    tenant_id   VARCHAR(32)  NOT NULL DEFAULT 'default',
    received_at TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Retention deletes by age.
CREATE INDEX IF NOT EXISTS inbox_messages_received ON inbox_messages (received_at);
