-- Rows waiting behind an earlier unsent or dead event of their aggregate
-- are marked held by the claim that first sees them, and leave the index
-- claims walk; settling the earlier event releases the next held row of its
-- aggregate. So a claim's cost no longer grows with the events piled up
-- behind a poison, retried or busy event.
ALTER TABLE outbox_events ADD COLUMN held BOOLEAN NOT NULL DEFAULT false;

-- Payload and metadata bytes as written, for the projector's batch budget.
-- Rows written before this migration count as 0.
ALTER TABLE outbox_events ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;

-- The claim's walk: due rows that are not held, in order.
CREATE INDEX IF NOT EXISTS outbox_events_due
    ON outbox_events (available_at, id)
    WHERE status IN ('new', 'publishing', 'failed') AND NOT held;

DROP INDEX IF EXISTS outbox_events_ready;

-- Releasing the next held row of an aggregate.
CREATE INDEX IF NOT EXISTS outbox_events_held
    ON outbox_events (tenant_id, aggregate_type, aggregate_id, aggregate_version)
    WHERE held;
