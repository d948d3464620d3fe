-- The live instances of each consumer group, for spreading its partitions:
-- each instance renews its row every few seconds, and the partitions are
-- dealt among the rows not yet expired (see package consumer). expires_ms
-- is in milliseconds since 1970 on the database's clock.
CREATE TABLE IF NOT EXISTS consumer_members (
    consumer   VARCHAR(200) NOT NULL,
    member_id  VARCHAR(200) NOT NULL,
    partitions INTEGER NOT NULL,
    expires_ms BIGINT NOT NULL,
    PRIMARY KEY (consumer, member_id)
);
