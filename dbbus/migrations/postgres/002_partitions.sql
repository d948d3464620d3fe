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

-- A message is its UUID on a topic: publishing a UUID again on the same
-- topic (a relay's retry) is a duplicate, but on another topic (a dead
-- letter, which keeps its message's UUID) it is a message of its own. Each
-- delivery names its body by both.
ALTER TABLE dbbus_deliveries ADD COLUMN IF NOT EXISTS topic VARCHAR(255) NOT NULL DEFAULT '';
UPDATE dbbus_deliveries AS d SET topic = m.topic FROM dbbus_messages AS m
WHERE m.id = d.message_id AND d.topic = '';
ALTER TABLE dbbus_messages DROP CONSTRAINT IF EXISTS dbbus_messages_pkey;
ALTER TABLE dbbus_messages ADD PRIMARY KEY (id, topic);
