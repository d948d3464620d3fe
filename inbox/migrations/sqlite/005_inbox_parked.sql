-- Events parked by a partitioned consumer instead of being applied out of
-- order: behind a hold or a parked predecessor ("held"), or waiting for a
-- predecessor that has not arrived ("waiting", then "gap" once the wait
-- outlasted the consumer's gap timeout). Each row keeps the whole message,
-- so the consumer applies it, in version order, as soon as nothing earlier
-- of its aggregate is missing; applying it deletes the row in the same
-- transaction.
CREATE TABLE IF NOT EXISTS inbox_parked (
    consumer       TEXT     NOT NULL,
    message_id     TEXT     NOT NULL,
    tenant_id      TEXT     NOT NULL,
    aggregate_type TEXT     NOT NULL,
    aggregate_id   TEXT     NOT NULL,
    version        INTEGER  NOT NULL,
    partition_no   INTEGER  NOT NULL,
    reason         TEXT     NOT NULL,
    metadata       TEXT     NOT NULL,
    payload        BLOB     NOT NULL,
    attempts       INTEGER  NOT NULL DEFAULT 0,
    last_error     TEXT     NOT NULL DEFAULT '',
    parked_at      DATETIME NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_parked_aggregate
    ON inbox_parked (consumer, tenant_id, aggregate_type, aggregate_id, version);
CREATE INDEX IF NOT EXISTS inbox_parked_partition ON inbox_parked (consumer, partition_no);
