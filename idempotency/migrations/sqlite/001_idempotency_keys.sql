-- The idempotency ledger: one row per (tenant, Idempotency-Key). See the
-- PostgreSQL migration. Times are written by Go in UTC.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant_id      VARCHAR(32)  NOT NULL DEFAULT 'default',
    idem_key       VARCHAR(255) NOT NULL,
    request_digest CHAR(64)     NOT NULL,
    state          VARCHAR(16)  NOT NULL CHECK (state IN ('in_progress', 'completed')),
    status_code    INTEGER      NOT NULL DEFAULT 0,
    headers        TEXT,
    body           BLOB,
    created_at     DATETIME     NOT NULL,
    expires_at     DATETIME     NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires ON idempotency_keys (expires_at);
