package dbbus

// PostgresClaimSQL and PostgresRescueSQL are the claim and rescue
// statements on PostgreSQL, for the plan tests.
var (
	PostgresClaimSQL  = pgStatements.claim
	PostgresRescueSQL = pgStatements.rescue
)
