-- The version watermark: per consumer and aggregate, the last version the
-- consumer applied. A delivery at or below it is a duplicate even after its
-- inbox_messages record was purged; with contiguous versions, one above it
-- plus one is a gap and waits. One row per aggregate a consumer has seen.
CREATE TABLE IF NOT EXISTS inbox_watermarks (
    consumer       TEXT     NOT NULL,
    tenant_id      TEXT     NOT NULL,
    aggregate_type TEXT     NOT NULL,
    aggregate_id   TEXT     NOT NULL,
    version        INTEGER  NOT NULL,
    updated_at     DATETIME NOT NULL,
    PRIMARY KEY (consumer, tenant_id, aggregate_type, aggregate_id)
);
