-- The live instances of each consumer group, for spreading its partitions:
-- each instance renews its row every few seconds, and the partitions are
-- dealt among the rows not yet expired (see package consumer). expires_ms
-- is in milliseconds since 1970 on the database's clock.
CREATE TABLE IF NOT EXISTS consumer_members (
    consumer   TEXT NOT NULL,
    member_id  TEXT NOT NULL,
    partitions INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (consumer, member_id)
);
