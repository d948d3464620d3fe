-- The claim's per-aggregate checks and the release of an aggregate's next
-- held row each read one row of an index, found by a range of its keys
-- written as row comparisons over (aggregate_id, aggregate_type,
-- tenant_id, aggregate_version); these indexes list their columns in that
-- order, as on PostgreSQL (see its migration 008 for why).
DROP INDEX IF EXISTS outbox_events_unsent_aggregate;
CREATE INDEX IF NOT EXISTS outbox_events_unsent_aggregate
    ON outbox_events (aggregate_id, aggregate_type, tenant_id, aggregate_version)
    WHERE status IN ('new', 'publishing', 'failed', 'dead') AND aggregate_id <> '';

DROP INDEX IF EXISTS outbox_events_held;
CREATE INDEX IF NOT EXISTS outbox_events_held
    ON outbox_events (aggregate_id, aggregate_type, tenant_id, aggregate_version)
    WHERE held;
