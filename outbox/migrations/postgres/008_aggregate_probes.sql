-- The claim's per-aggregate checks (an earlier or later unsent event of
-- the row's aggregate, an earlier event the claiming projector leased) and
-- the release of an aggregate's next held row each read one row of an
-- index, found by a range of its keys written as row comparisons over
-- (aggregate_id, aggregate_type, tenant_id, aggregate_version). These
-- indexes lead with aggregate_id, which no other index does, so no other
-- index can read such a range and the planner cannot trade the probe for a
-- scan however wrong its statistics are (led by tenant_id, as 002 and 005
-- made them, they competed with outbox_events_unsent and
-- outbox_events_aggregate_version, whose leading tenant_id it could use).
DROP INDEX IF EXISTS outbox_events_unsent_aggregate;
CREATE INDEX IF NOT EXISTS outbox_events_unsent_aggregate
    ON outbox_events (aggregate_id, aggregate_type, tenant_id, aggregate_version)
    WHERE status IN ('new', 'publishing', 'failed', 'dead') AND aggregate_id <> '';

DROP INDEX IF EXISTS outbox_events_held;
CREATE INDEX IF NOT EXISTS outbox_events_held
    ON outbox_events (aggregate_id, aggregate_type, tenant_id, aggregate_version)
    WHERE held;

-- A claim holds back a row waiting behind an earlier event of its
-- aggregate unless the claiming projector itself leased that event (it
-- settles it soon, and the row is due again then): only leased rows, by
-- projector, then aggregate, then version.
CREATE INDEX IF NOT EXISTS outbox_events_leased
    ON outbox_events (locked_by, aggregate_id, aggregate_type, tenant_id, aggregate_version)
    WHERE status = 'publishing' AND aggregate_id <> '';
