package dbbus

// PostgresClaimSQL and PostgresRescueSQL are the claim and rescue
// statements on PostgreSQL, for the plan tests.
var (
	PostgresClaimSQL  = pgStatements.claim
	PostgresRescueSQL = pgStatements.rescue
)

// TakeOverSQL is the statement a new owner of a queue runs, for the plan
// tests.
var TakeOverSQL = takeOver
