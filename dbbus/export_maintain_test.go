package dbbus

import "github.com/bentoevents/bento/internal/dialect"

// The maintenance statements on PostgreSQL, for the plan tests.
var (
	PostgresPurgeUnroutableSQL = purgeUnroutableSQL(dialect.Postgres)
	PurgeAllSQL                = purgeAllSQL
	PickReadySQL               = pickQueueSQL("IS NULL")
	PickLeasedSQL              = pickQueueSQL("IS NOT NULL")
	DeleteIDsSQL               = deleteIDsSQL
	PeekSQL                    = peekDeliveries
	PostgresAgeSQL             = ageSQL(dialect.Postgres)
)
