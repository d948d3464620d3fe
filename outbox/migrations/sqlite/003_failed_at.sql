-- When the row's last publish attempt failed (or its lease expired), so
-- operators can chart failures per minute. NULL for rows that never failed.
ALTER TABLE outbox_events ADD COLUMN failed_at DATETIME;

-- The console and CLI chart recent failures.
CREATE INDEX IF NOT EXISTS outbox_events_failed_at
    ON outbox_events (failed_at)
    WHERE failed_at IS NOT NULL;
