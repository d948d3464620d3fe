-- The inbox, partitioned (inbox.Migrate with MigrateOpts.Partitioning).
--
-- The primary key (consumer, message_id) is the dedup, and a unique key of a
-- partitioned table must contain the partition key. Partitioning by
-- received_at would make the key (consumer, message_id, received_at), which
-- a redelivery never conflicts with. So the table is partitioned by
-- message_id itself: bento's message ids are ULIDs, whose first ten
-- characters encode their creation time and sort by it, so a range of ids is
-- a range of time and the primary key stays exactly (consumer, message_id).
-- Every delivery of a message goes to the same partition. Ids that are not
-- ULIDs (or fall outside every range) go to the default partition. The "C"
-- collation makes ids compare byte by byte, as ULIDs sort.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer    VARCHAR(200) NOT NULL,
    message_id  VARCHAR(128) COLLATE "C" NOT NULL,
    tenant_id   VARCHAR(32)  NOT NULL DEFAULT 'default',
    received_at TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (consumer, message_id)
) PARTITION BY RANGE (message_id);

CREATE TABLE IF NOT EXISTS inbox_messages_default PARTITION OF inbox_messages DEFAULT;

-- Retention deletes by age.
CREATE INDEX IF NOT EXISTS inbox_messages_received ON inbox_messages (received_at);
