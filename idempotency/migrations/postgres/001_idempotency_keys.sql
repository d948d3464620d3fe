-- The idempotency ledger: one row per (tenant, Idempotency-Key). The primary
-- key is the dedup: a repeat's insert conflicts (after waiting for the first
-- request's transaction when it is still running) and the stored response is
-- replayed. A row is inserted 'in_progress' and updated to 'completed' in the
-- same transaction as the handler's work, so only completed rows are ever
-- visible to other transactions.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant_id      VARCHAR(32)  NOT NULL DEFAULT 'default',
    idem_key       VARCHAR(255) NOT NULL,
    request_digest CHAR(64)     NOT NULL,
    state          VARCHAR(16)  NOT NULL CHECK (state IN ('in_progress', 'completed')),
    status_code    INTEGER      NOT NULL DEFAULT 0,
    headers        JSONB,
    body           BYTEA,
    created_at     TIMESTAMPTZ  NOT NULL,
    expires_at     TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
);

-- Purge deletes by expiry.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires ON idempotency_keys (expires_at);
