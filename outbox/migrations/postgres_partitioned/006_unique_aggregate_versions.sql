-- A tenant's (aggregate type, aggregate id, version) names one event (see
-- the unpartitioned table's migration). A unique index of a partitioned
-- table must contain the partition key, so, as for dedup keys, a BEFORE
-- INSERT trigger reserves the version in outbox_aggregate_versions, whose
-- primary key carries the index's name: a second event of a version fails
-- with the same unique violation as on the unpartitioned table, and a
-- racing writer waits for the first one's commit as it would on an index.
-- A version stays reserved until maintenance drops the partition of its
-- event.
CREATE TABLE IF NOT EXISTS outbox_aggregate_versions (
    tenant_id         VARCHAR(32)  NOT NULL,
    aggregate_type    VARCHAR(50)  NOT NULL,
    aggregate_id      VARCHAR(64)  NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    event_id          VARCHAR(26)  NOT NULL,
    created_at        TIMESTAMPTZ  NOT NULL,
    CONSTRAINT outbox_events_aggregate_version
        PRIMARY KEY (tenant_id, aggregate_type, aggregate_id, aggregate_version)
);

CREATE INDEX IF NOT EXISTS outbox_aggregate_versions_created ON outbox_aggregate_versions (created_at);

INSERT INTO outbox_aggregate_versions
SELECT tenant_id, aggregate_type, aggregate_id, aggregate_version, id, created_at
FROM outbox_events WHERE aggregate_id <> '';

CREATE OR REPLACE FUNCTION outbox_events_unique_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.aggregate_id <> '' THEN
        INSERT INTO outbox_aggregate_versions
        VALUES (NEW.tenant_id, NEW.aggregate_type, NEW.aggregate_id, NEW.aggregate_version, NEW.id, NEW.created_at);
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_events_unique_version ON outbox_events;
CREATE TRIGGER outbox_events_unique_version
    BEFORE INSERT ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION outbox_events_unique_version();
