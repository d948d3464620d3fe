-- Partitioned groups. A group with a row here is split into `partitions`
-- queues, "<group>.p<k>"; a message matching one of its bindings gets one
-- delivery row, in the queue its partition key hashes to.
CREATE TABLE IF NOT EXISTS dbbus_partitions (
    group_name VARCHAR(200) PRIMARY KEY,
    partitions INTEGER      NOT NULL
);

-- The single active consumer of a queue (a partition): one row per queue
-- that a subscription owns, with the owner's random token and an expiry by
-- the database's clock, renewed while the subscription lives. A row whose
-- lease has lapsed is taken over by the next subscription.
CREATE TABLE IF NOT EXISTS dbbus_queue_owners (
    queue        VARCHAR(200) PRIMARY KEY,
    owner        VARCHAR(64)  NOT NULL,
    leased_until TIMESTAMPTZ  NOT NULL
);
