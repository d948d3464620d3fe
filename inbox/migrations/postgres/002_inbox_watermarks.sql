-- The version watermark: per consumer and aggregate, the last version the
-- consumer applied. A delivery at or below it is a duplicate even after its
-- inbox_messages record was purged; with contiguous versions, one above it
-- plus one is a gap and waits. One row per aggregate a consumer has seen.
CREATE TABLE IF NOT EXISTS inbox_watermarks (
    consumer       VARCHAR(200) NOT NULL,
    tenant_id      VARCHAR(32)  NOT NULL,
    aggregate_type VARCHAR(255) NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    version        BIGINT       NOT NULL,
    updated_at     TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);
