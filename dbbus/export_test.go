package dbbus

// PostgresClaimSQL, PostgresRescueSQL and PostgresBrowseSQL are the
// claim, rescue and browse statements on PostgreSQL, for the plan tests.
var (
	PostgresClaimSQL  = pgStatements.claim
	PostgresRescueSQL = pgStatements.rescue
	PostgresBrowseSQL = pgStatements.browse
)
