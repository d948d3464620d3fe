-- Scheduled messages (Store.Schedule) wait here, not in outbox_events, until
-- they fall due: then a projector moves them into outbox_events in one
-- transaction (Store.ReleaseDue) and relays them like any event. Kept apart,
-- a message scheduled for next month is neither backlog to the outbox's
-- monitoring nor a row in an outbox partition that could otherwise be
-- dropped. A released row stays (released_at set) until retention removes
-- it, so that a cancel that comes too late can say so.
CREATE TABLE IF NOT EXISTS outbox_scheduled (
    id             VARCHAR(26)   PRIMARY KEY,        -- the event id it is relayed with
    tenant_id      VARCHAR(32)   NOT NULL DEFAULT 'default',
    topic          VARCHAR(100)  NOT NULL,
    schedule_key   VARCHAR(255)  NOT NULL DEFAULT '', -- what Store.Cancel names; '' for none
    schema_version SMALLINT      NOT NULL DEFAULT 1,
    payload        JSONB         NOT NULL,
    metadata       JSONB         NOT NULL DEFAULT '{}',
    occurred_at    TIMESTAMPTZ   NOT NULL,
    created_at     TIMESTAMPTZ   NOT NULL,
    due_at         TIMESTAMPTZ   NOT NULL,
    size_bytes     INTEGER       NOT NULL DEFAULT 0,
    released_at    TIMESTAMPTZ
);

-- The due-time lookup: only rows still waiting, in due order, so finding
-- the due ones reads as many index entries as there are due rows, however
-- many wait for later.
CREATE INDEX IF NOT EXISTS outbox_scheduled_due
    ON outbox_scheduled (due_at, id)
    WHERE released_at IS NULL;

-- Cancel's lookup by key.
CREATE INDEX IF NOT EXISTS outbox_scheduled_key
    ON outbox_scheduled (tenant_id, schedule_key)
    WHERE schedule_key <> '';

-- Retention: released rows by when they were released.
CREATE INDEX IF NOT EXISTS outbox_scheduled_released
    ON outbox_scheduled (released_at)
    WHERE released_at IS NOT NULL;

-- A scheduled row wakes an idle projector as an event does, so it learns
-- the new due time.
DROP TRIGGER IF EXISTS outbox_scheduled_notify ON outbox_scheduled;
CREATE TRIGGER outbox_scheduled_notify
    AFTER INSERT ON outbox_scheduled
    FOR EACH ROW EXECUTE FUNCTION outbox_events_notify();
