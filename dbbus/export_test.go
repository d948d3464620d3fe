package dbbus

import (
	"context"

	"gorm.io/gorm"
)

// PostgresClaimSQL, PostgresRescueSQL and PostgresBrowseSQL are the
// claim, rescue and browse statements on PostgreSQL, for the plan tests.
var (
	PostgresClaimSQL  = pgStatements.claim
	PostgresRescueSQL = pgStatements.rescue
	PostgresBrowseSQL = pgStatements.browse
)

// TakeOverSQL is the statement a new owner of a queue runs, for the plan
// tests.
var TakeOverSQL = takeOver

// The statements of a settle and of a read of bodies on PostgreSQL, for
// the plan tests.
var (
	PostgresReadBodiesSQL   = pgStatements.readBodies
	PostgresLockBodiesSQL   = pgStatements.lockBodies
	PostgresDeleteBodiesSQL = pgStatements.deleteBodies
	DeleteDeliveriesSQL     = deleteDeliveries
	PostgresAsyncAckSQL     = pgAsyncAck
	ReleaseDeliveriesSQL    = releaseDeliveries
	PostgresRenewSQL        = pgStatements.renew
)

// PostgresKeys is how the statements above take a list of message keys
// (ids[i] on topics[i]).
func PostgresKeys(ids, topics []string) []any {
	keys := make([]messageKey, len(ids))
	for i := range ids {
		keys[i] = messageKey{ids[i], topics[i]}
	}
	return keyArrays(keys)
}

// AckAll is the ack of the bus's acker: several leases, of any claims, in
// one transaction.
func AckAll(ctx context.Context, db *gorm.DB, leases []Lease) error {
	return ackAll(ctx, db, leases, true)
}
