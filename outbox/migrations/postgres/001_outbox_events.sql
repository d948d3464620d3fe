-- The transactional outbox: one row per event to relay.
CREATE TABLE IF NOT EXISTS outbox_events (
    id                VARCHAR(26)   PRIMARY KEY,            -- ULID, also the message id on the wire
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
    CONSTRAINT outbox_events_status_check
        CHECK (status IN ('new', 'publishing', 'sent', 'failed', 'dead'))
);

-- Only the rows that still need work: claim cost stays flat as sent rows pile up.
CREATE INDEX IF NOT EXISTS outbox_events_ready
    ON outbox_events (available_at, id)
    WHERE status IN ('new', 'publishing', 'failed');

-- Manual-mode dedup key, unique per tenant.
CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_dedup
    ON outbox_events (tenant_id, dedup_key)
    WHERE dedup_key IS NOT NULL;

-- Wake projectors when new rows commit. NOTIFY inside a transaction is
-- delivered on commit and dropped on rollback; identical payloads in one
-- transaction are sent once.
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
