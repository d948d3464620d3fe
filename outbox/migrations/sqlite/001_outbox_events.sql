-- The transactional outbox: one row per event to relay. Times are written by
-- bento in UTC, never by SQLite defaults, so they compare as text.
CREATE TABLE IF NOT EXISTS outbox_events (
    id                TEXT    PRIMARY KEY NOT NULL CHECK (length(id) = 26),
    tenant_id         TEXT    NOT NULL DEFAULT 'default',
    topic             TEXT    NOT NULL,
    aggregate_type    TEXT    NOT NULL DEFAULT '',
    aggregate_id      TEXT    NOT NULL DEFAULT '',
    aggregate_version INTEGER NOT NULL DEFAULT 0,
    schema_version    INTEGER NOT NULL DEFAULT 1,
    payload           TEXT    NOT NULL CHECK (json_valid(payload)),
    metadata          TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    occurred_at       DATETIME NOT NULL,
    created_at        DATETIME NOT NULL,
    status            TEXT    NOT NULL DEFAULT 'new'
        CHECK (status IN ('new', 'publishing', 'sent', 'failed', 'dead')),
    attempts          INTEGER NOT NULL DEFAULT 0,
    available_at      DATETIME NOT NULL,
    locked_by         TEXT,
    locked_until      DATETIME,
    last_error        TEXT,
    published_at      DATETIME,
    dedup_key         TEXT
);

CREATE INDEX IF NOT EXISTS outbox_events_ready
    ON outbox_events (available_at, id)
    WHERE status IN ('new', 'publishing', 'failed');

CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_dedup
    ON outbox_events (tenant_id, dedup_key)
    WHERE dedup_key IS NOT NULL;
