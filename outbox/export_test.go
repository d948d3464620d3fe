package outbox

import "github.com/bentoevents/bento/internal/dialect"

// PostgresClaimSQL exposes the PostgreSQL claim statement to tests.
func PostgresClaimSQL() string { return claimSQL(dialect.Postgres, false) }
