-- Attempts at messages a consumer received again (redelivered): whether an
-- attempt is running, and how many attempts were still running when the
-- process making them died (crashed, was killed, or lost its place). The
-- consumer dead-letters a message whose attempts kept dying as poison; the
-- messages a dead process merely held, and never started, are never
-- counted. A row is deleted once its message is applied or dead-lettered.
CREATE TABLE IF NOT EXISTS inbox_attempts (
    consumer   VARCHAR(200) NOT NULL,
    message_id VARCHAR(128) NOT NULL,
    running    INTEGER      NOT NULL DEFAULT 0,
    crashes    INTEGER      NOT NULL DEFAULT 0,
    updated_at TIMESTAMP    NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
