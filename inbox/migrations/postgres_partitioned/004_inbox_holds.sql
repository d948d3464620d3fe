-- Aggregates held back behind a dead letter: per consumer and aggregate,
-- the dead-lettered message and its version. Later versions of the
-- aggregate are refused (dead-lettered as held) until that message is
-- applied (replayed) or the hold is released (discarded).
CREATE TABLE IF NOT EXISTS inbox_holds (
    consumer       VARCHAR(255) NOT NULL,
    tenant_id      VARCHAR(255) NOT NULL,
    aggregate_type VARCHAR(255) NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    version        BIGINT NOT NULL,
    message_id     VARCHAR(255) NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);
