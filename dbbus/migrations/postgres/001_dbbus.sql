-- The database bus. One body row per published message, one delivery row
-- per (group, message): each group acks, counts attempts and leases on its
-- own rows, so no group waits on another and no row is shared by a group's
-- consumers. A delivery is ready when lease_token is NULL, leased otherwise
-- (until leased_until, by the database's clock); an ack deletes it.
CREATE TABLE IF NOT EXISTS dbbus_messages (
    id         VARCHAR(128) PRIMARY KEY,
    topic      VARCHAR(255) NOT NULL,
    metadata   TEXT         NOT NULL,
    payload    BYTEA        NOT NULL,
    created_at TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS dbbus_deliveries (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_name   VARCHAR(200) NOT NULL,
    message_id   VARCHAR(128) NOT NULL,
    attempts     INTEGER      NOT NULL DEFAULT 0,
    lease_token  VARCHAR(64),
    leased_until TIMESTAMPTZ
);

-- The claim reads a group's ready rows in id order from this index alone:
-- leased rows are not in it, so its size is the backlog, not the history.
CREATE INDEX IF NOT EXISTS dbbus_deliveries_ready
    ON dbbus_deliveries (group_name, id) WHERE lease_token IS NULL;

-- The rescue of expired leases reads only leased rows.
CREATE INDEX IF NOT EXISTS dbbus_deliveries_leased
    ON dbbus_deliveries (group_name, leased_until) WHERE lease_token IS NOT NULL;

-- An ack deletes the body once no delivery references it.
CREATE INDEX IF NOT EXISTS dbbus_deliveries_message ON dbbus_deliveries (message_id);

-- Routing: a message goes to every group with a pattern matching its topic.
CREATE TABLE IF NOT EXISTS dbbus_bindings (
    group_name VARCHAR(200) NOT NULL,
    pattern    VARCHAR(255) NOT NULL,
    PRIMARY KEY (group_name, pattern)
);
