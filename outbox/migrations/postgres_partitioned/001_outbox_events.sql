-- The transactional outbox, partitioned by created_at in daily or monthly
-- ranges (outbox.Migrate with MigrateOpts.Partitioning). Same columns as the
-- unpartitioned table; the later migrations apply to both.
--
-- A primary key or unique index of a partitioned table must contain the
-- partition key, so the key is (id, created_at) and the dedup key's
-- uniqueness moves to outbox_dedup_keys below.
CREATE TABLE IF NOT EXISTS outbox_events (
    id                VARCHAR(26)   NOT NULL,               -- ULID, also the message id on the wire
    tenant_id         VARCHAR(32)   NOT NULL DEFAULT 'default',
    topic             VARCHAR(100)  NOT NULL,               -- event type, also the routing key
    aggregate_type    VARCHAR(50)   NOT NULL DEFAULT '',
    aggregate_id      VARCHAR(64)   NOT NULL DEFAULT '',
    aggregate_version BIGINT        NOT NULL DEFAULT 0,
    schema_version    SMALLINT      NOT NULL DEFAULT 1,
    payload           JSONB         NOT NULL,
    metadata          JSONB         NOT NULL DEFAULT '{}',
    occurred_at       TIMESTAMPTZ   NOT NULL,
    created_at        TIMESTAMPTZ   NOT NULL DEFAULT now(),
    status            VARCHAR(16)   NOT NULL DEFAULT 'new',
    attempts          INTEGER       NOT NULL DEFAULT 0,
    available_at      TIMESTAMPTZ   NOT NULL DEFAULT now(),  -- next try; while publishing, the lease end
    locked_by         VARCHAR(128),
    locked_until      TIMESTAMPTZ,
    last_error        VARCHAR(2000),
    published_at      TIMESTAMPTZ,
    dedup_key         VARCHAR(255),
    CONSTRAINT outbox_events_pkey PRIMARY KEY (id, created_at),
    CONSTRAINT outbox_events_status_check
        CHECK (status IN ('new', 'publishing', 'sent', 'failed', 'dead'))
) PARTITION BY RANGE (created_at);

-- Rows outside every range partition land here, so a commit never fails
-- because maintenance fell behind. Maintenance never drops it.
CREATE TABLE IF NOT EXISTS outbox_events_default PARTITION OF outbox_events DEFAULT;

-- Only the rows that still need work: claim cost stays flat as sent rows pile up.
CREATE INDEX IF NOT EXISTS outbox_events_ready
    ON outbox_events (available_at, id)
    WHERE status IN ('new', 'publishing', 'failed');

-- Manual-mode dedup key, unique per tenant across all partitions: a BEFORE
-- INSERT trigger reserves the key here and skips the row when it is taken,
-- which is what ON CONFLICT DO NOTHING does on the unpartitioned table. A
-- key stays reserved until maintenance drops the partition of its event.
CREATE TABLE IF NOT EXISTS outbox_dedup_keys (
    tenant_id  VARCHAR(32)  NOT NULL,
    dedup_key  VARCHAR(255) NOT NULL,
    event_id   VARCHAR(26)  NOT NULL,
    created_at TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (tenant_id, dedup_key)
);

CREATE INDEX IF NOT EXISTS outbox_dedup_keys_created ON outbox_dedup_keys (created_at);

-- Lookups by key (not unique here: see outbox_dedup_keys).
CREATE INDEX IF NOT EXISTS outbox_events_dedup
    ON outbox_events (tenant_id, dedup_key)
    WHERE dedup_key IS NOT NULL;

CREATE OR REPLACE FUNCTION outbox_events_dedup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.dedup_key IS NULL THEN
        RETURN NEW;
    END IF;
    INSERT INTO outbox_dedup_keys (tenant_id, dedup_key, event_id, created_at)
    VALUES (NEW.tenant_id, NEW.dedup_key, NEW.id, NEW.created_at)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    RETURN NULL; -- key taken: skip the row
END
$$;

DROP TRIGGER IF EXISTS outbox_events_dedup ON outbox_events;
CREATE TRIGGER outbox_events_dedup
    BEFORE INSERT ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION outbox_events_dedup();

-- Wake projectors when new rows commit (as in the unpartitioned table).
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bento_outbox', TG_TABLE_SCHEMA || ':' || NEW.tenant_id);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION outbox_events_notify();
