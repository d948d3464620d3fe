// Package chaos attacks a system built on bento with randomized, combined
// faults and checks the outcome with a checker of its own: a seeded fault
// campaign, for bento's own tests and for yours.
//
// # What a campaign does
//
// Run takes a System (your tables, one command, your consumer groups and
// their handlers) and a Config (the stack: PostgreSQL with RabbitMQ,
// PostgreSQL with the database bus, or SQLite with the database bus). It
// starts the projectors and every group's instances as processes of their
// own, each under a supervisor that restarts it when it dies and each
// with TCP proxies of its own to the database and the broker; writers in
// the test process run the command on many aggregates (a few of them hot)
// at a steady rate. Meanwhile a nemesis strikes the faults of a schedule
// drawn from the seed: SIGKILL, SIGSTOP/SIGCONT, crash loops, instances
// joining and leaving (partition moves), links cut, hung and slowed,
// long transactions, a skewed writer clock and ANALYZE of skewed tables
// (see Fault). Faults overlap, strike neighbours and repeat. After
// Config.Duration every fault heals, the writers stop, and the system has
// Config.Settle to apply what was committed.
//
// # The checker
//
// The checker reads two ledgers that bento's own tables play no part in:
// every event a unit of work commits is written to chaos_commits in the
// same transaction (uow.Config.BeforeCommit), and every application of an
// event by a handler registered with Handle is written to chaos_applied
// in the handler's transaction. It then requires, per group: every
// committed event of the group's topics applied exactly once; each
// aggregate's events applied in version order (partitioned groups); no
// event dead-lettered but the poison System.Poison names, every poison
// dead-lettered, and in partitioned groups nothing of its aggregate
// applied after it; nothing left held or parked but behind poison; and
// all of it within Settle of the faults healing, and no event waiting
// longer than Config.MaxLag from its commit to its application, faults or
// not. Each broken rule is a
// Violation, and fails the test.
//
// A seed replays the same schedule of faults and commands (not the same
// interleaving: the machine decides that), so a failing seed printed in a
// log can be run again with Config.Seed.
//
// # Your own service
//
// Build a System from your aggregates and handlers, register handlers with
// Handle instead of consumer.Handle, emit a handler's events through
// Env.Units, and call Run from a test. Run starts the processes by running
// the test binary again with the same test selected: in those processes
// Run plays its part and never returns, so call it before anything with
// effects outside the process, or guard them with IsChild.
//
// The campaign needs a Unix system (signals) and, for its PostgreSQL and
// RabbitMQ stacks, services on this machine: it refuses any other
// address, creates a schema and an exchange of its own per run and drops
// them afterwards (unless Config.Keep).
package chaos
