-- Aggregates held back behind a dead letter: per consumer and aggregate,
-- the dead-lettered message and its version. Later versions of the
-- aggregate are refused (dead-lettered as held) until that message is
-- applied (replayed) or the hold is released (discarded).
CREATE TABLE IF NOT EXISTS inbox_holds (
    consumer       TEXT NOT NULL,
    tenant_id      TEXT NOT NULL,
    aggregate_type TEXT NOT NULL,
    aggregate_id   TEXT NOT NULL,
    version        INTEGER NOT NULL,
    message_id     TEXT NOT NULL,
    created_at     DATETIME NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);
