-- Keys scoped to their caller (Config.Scope) are stored as a digest of the
-- caller, then the key: room for both. SQLite's TEXT has no length.
ALTER TABLE idempotency_keys ALTER COLUMN idem_key TYPE VARCHAR(320);
