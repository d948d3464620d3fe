-- A tenant's (aggregate type, aggregate id, version) names one event: the
-- relay orders an aggregate's events by version, so two events of one
-- version would have no order. This fails on a table that already holds such
-- duplicates (written by Store.Add before version 1 was required); see
-- docs/operations.md for the query that finds them.
CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_aggregate_version
    ON outbox_events (tenant_id, aggregate_type, aggregate_id, aggregate_version)
    WHERE aggregate_id <> '';
