-- Per-aggregate order: a claim looks for an earlier unsent event of the same
-- aggregate; this index holds only unsent (and dead) rows, so that lookup
-- stays small however many events were sent.
CREATE INDEX IF NOT EXISTS outbox_events_unsent_aggregate
    ON outbox_events (tenant_id, aggregate_type, aggregate_id, aggregate_version)
    WHERE status IN ('new', 'publishing', 'failed', 'dead') AND aggregate_id <> '';

-- Retention deletes sent rows by age.
CREATE INDEX IF NOT EXISTS outbox_events_sent
    ON outbox_events (published_at)
    WHERE status = 'sent';

-- Operators list dead rows.
CREATE INDEX IF NOT EXISTS outbox_events_dead
    ON outbox_events (id)
    WHERE status = 'dead';
