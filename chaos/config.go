package chaos

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"
)

// ErrInvalidConfig is returned (wrapped, naming each bad field) for a
// Config or System that cannot run.
var ErrInvalidConfig = errors.New("chaos: invalid config")

// Stack is the database and bus a campaign runs bento on.
type Stack string

// The stacks.
const (
	// PostgresRabbitMQ relays the outbox to RabbitMQ, bento's production
	// path with a broker.
	PostgresRabbitMQ Stack = "postgres+rabbitmq"
	// PostgresDatabaseBus relays to the database bus (package dbbus) in
	// PostgreSQL: production without a broker.
	PostgresDatabaseBus Stack = "postgres+dbbus"
	// SQLiteDatabaseBus is the embedded default: SQLite and the database
	// bus, every process on one file. It has no network links to attack.
	SQLiteDatabaseBus Stack = "sqlite+dbbus"
)

func (s Stack) postgres() bool { return s == PostgresRabbitMQ || s == PostgresDatabaseBus }

// Config configures a campaign. Zero fields take their defaults.
type Config struct {
	// Stack is what bento runs on. Required.
	Stack Stack
	// PostgresDSN reaches a PostgreSQL database the campaign may use, as a
	// postgres:// URL on a loopback address: each run creates a schema of
	// its own there and drops it at the end. Required on the PostgreSQL
	// stacks.
	PostgresDSN string
	// AMQPURL reaches a RabbitMQ broker on a loopback address, with the
	// consistent-hash exchange plugin. Each run declares an exchange and
	// queues of its own and deletes them at the end. Required on
	// PostgresRabbitMQ.
	AMQPURL string
	// Dir holds the processes' logs and, on SQLiteDatabaseBus, the
	// database file. Defaults to a temporary directory of the test.
	Dir string
	// Seed chooses the faults, their times and targets, and the writers'
	// commands: a seed replays the same schedule (not the same
	// interleaving, which the machine decides). Defaults to a fresh
	// random seed, printed with the report.
	Seed uint64
	// Duration is how long writers run and faults strike. Defaults to
	// 60s.
	Duration time.Duration
	// Settle bounds how long, once every fault has healed, the system may
	// take to apply everything committed (liveness): what is not applied
	// by then is a violation. Defaults to 3m.
	Settle time.Duration
	// MaxLag bounds how long any event may wait, from its commit to its
	// application, during the faults as after them: an event applied later
	// is a Stalled violation, so a system that stands still for a while
	// and then catches up does not pass unseen. Events held behind poison
	// are not applied and not counted. Defaults to Settle.
	MaxLag time.Duration
	// Faults are the kinds of fault to inject. Defaults to every kind the
	// stack has (see Fault). A kind the stack does not have is an error.
	Faults []Fault
	// MeanGap is the mean time between two faults' starts; faults
	// overlap when one lasts longer. Defaults to 3s.
	MeanGap time.Duration
	// Projectors is how many projector processes run. Defaults to 2.
	Projectors int
	// Instances is how many processes run each group. Defaults to 2.
	Instances int
	// Writers is how many goroutines of the test process run commands.
	// Defaults to 4.
	Writers int
	// Rate is how many commands a second the writers run together, at
	// most. Defaults to 100.
	Rate int
	// Aggregates is how many aggregate ids the writers spread their
	// commands over. Defaults to 200.
	Aggregates int
	// Hot is how many of them take a fifth of the commands, so that
	// writers conflict and some aggregates have long histories. Defaults
	// to 3.
	Hot int
	// Keep leaves the run's schema (PostgreSQL) and queues (RabbitMQ) in
	// place after the run, for an engineer to inspect; the report's first
	// log line names them. Defaults to false: they are deleted.
	Keep bool
	// Exclude lists fault kinds not to inject, after Faults' default.
	Exclude []Fault
}

func (c *Config) withDefaults() Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defd(&out.Duration, time.Minute)
	defd(&out.Settle, 3*time.Minute)
	defd(&out.MeanGap, 3*time.Second)
	defd(&out.MaxLag, out.Settle)
	def(&out.Projectors, 2)
	def(&out.Instances, 2)
	def(&out.Writers, 4)
	def(&out.Rate, 100)
	def(&out.Aggregates, 200)
	def(&out.Hot, 3)
	if len(out.Faults) == 0 {
		out.Faults = out.Stack.Faults()
	}
	out.Faults = slices.DeleteFunc(slices.Clone(out.Faults), func(f Fault) bool { return slices.Contains(out.Exclude, f) })
	return out
}

// validate names every bad field of a defaulted config and of sys.
func (c *Config) validate(sys *System) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	switch c.Stack {
	case PostgresRabbitMQ, PostgresDatabaseBus, SQLiteDatabaseBus:
	default:
		bad("Stack %q is not one of %s, %s, %s", c.Stack, PostgresRabbitMQ, PostgresDatabaseBus, SQLiteDatabaseBus)
	}
	if c.Stack.postgres() {
		if u, err := url.Parse(c.PostgresDSN); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Port() == "" {
			bad("PostgresDSN must be a postgres:// URL with a host and port")
		}
	}
	if c.Stack == PostgresRabbitMQ {
		if u, err := url.Parse(c.AMQPURL); err != nil || u.Scheme != "amqp" || u.Port() == "" {
			bad("AMQPURL must be an amqp:// URL with a host and port")
		}
	}
	for _, f := range c.Faults {
		if !slices.Contains(c.Stack.Faults(), f) {
			bad("Faults: %s has no %q fault", c.Stack, f)
		}
	}
	for name, v := range map[string]int{"Projectors": c.Projectors, "Instances": c.Instances, "Writers": c.Writers, "Rate": c.Rate, "Aggregates": c.Aggregates} {
		if v < 1 {
			bad("%s must be positive", name)
		}
	}
	if c.Hot < 0 || c.Hot > c.Aggregates {
		bad("Hot must be between 0 and Aggregates")
	}
	for name, v := range map[string]time.Duration{"Duration": c.Duration, "Settle": c.Settle, "MeanGap": c.MeanGap, "MaxLag": c.MaxLag} {
		if v < 0 {
			bad("%s must not be negative", name)
		}
	}
	if sys == nil {
		bad("no System")
		return errors.Join(errs...)
	}
	if sys.Command == nil {
		bad("System.Command is required")
	}
	if len(sys.Groups) == 0 {
		bad("System.Groups: at least one group")
	}
	seen := map[string]bool{}
	for i, g := range sys.Groups {
		if g.Name == "" || seen[g.Name] {
			bad("System.Groups[%d]: a name, unique", i)
		}
		seen[g.Name] = true
		if len(g.Topics) == 0 {
			bad("System.Groups[%d] (%s): at least one topic", i, g.Name)
		}
		if g.Register == nil {
			bad("System.Groups[%d] (%s): Register is required", i, g.Name)
		}
	}
	return errors.Join(errs...)
}
