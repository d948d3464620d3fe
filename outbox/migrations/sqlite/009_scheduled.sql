-- Scheduled messages (Store.Schedule) wait here until they fall due; a
-- projector then moves them into outbox_events (Store.ReleaseDue). See the
-- PostgreSQL migration of the same number.
CREATE TABLE IF NOT EXISTS outbox_scheduled (
    id             TEXT     PRIMARY KEY NOT NULL CHECK (length(id) = 26),
    tenant_id      TEXT     NOT NULL DEFAULT 'default',
    topic          TEXT     NOT NULL,
    schedule_key   TEXT     NOT NULL DEFAULT '',
    schema_version INTEGER  NOT NULL DEFAULT 1,
    payload        TEXT     NOT NULL CHECK (json_valid(payload)),
    metadata       TEXT     NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    occurred_at    DATETIME NOT NULL,
    created_at     DATETIME NOT NULL,
    due_at         DATETIME NOT NULL,
    size_bytes     INTEGER  NOT NULL DEFAULT 0,
    released_at    DATETIME
);

CREATE INDEX IF NOT EXISTS outbox_scheduled_due
    ON outbox_scheduled (due_at, id)
    WHERE released_at IS NULL;

CREATE INDEX IF NOT EXISTS outbox_scheduled_key
    ON outbox_scheduled (tenant_id, schedule_key)
    WHERE schedule_key <> '';

CREATE INDEX IF NOT EXISTS outbox_scheduled_released
    ON outbox_scheduled (released_at)
    WHERE released_at IS NOT NULL;
