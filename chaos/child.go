package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
)

// The environment a campaign's processes find their part in.
const (
	envChild    = "BENTO_CHAOS_CHILD"
	envInstance = "BENTO_CHAOS_INSTANCE"
)

// Roles of a campaign's processes.
const (
	roleProjector = "projector"
	roleConsumer  = "consumer"
)

// childSpec tells a process started by Run what to be.
type childSpec struct {
	Role  string `json:"role"`
	Group string `json:"group,omitempty"` // the System's name for it
	Stack Stack  `json:"stack"`
	// DSN is the database: a PostgreSQL URL through the process's proxy,
	// or the SQLite file.
	DSN      string `json:"dsn"`
	AMQPURL  string `json:"amqp_url,omitempty"`
	Exchange string `json:"exchange,omitempty"`
	RunID    string `json:"run_id"`
}

// IsChild reports whether this process is one Run started to play a
// projector or a consumer instance. In such a process Run never returns:
// call Run before anything else the test does that has effects outside
// the process (creating schemas, queues, files), or guard it with
// IsChild.
func IsChild() bool { return os.Getenv(envChild) != "" }

// groupName is a group's name in the run identified by runID.
func groupName(name, runID string) string { return name + "." + runID }

// openDB opens the database of a stack for a process of the campaign.
func openDB(stack Stack, dsn string) (*gorm.DB, error) {
	if stack == SQLiteDatabaseBus {
		return embedded.OpenSQLite(dsn, nil)
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(24)
	return db, nil
}

// runChild plays the part spec describes until SIGTERM, then exits the
// process. A failure to start exits with status 3, which the supervisor
// answers by starting the process again.
func runChild(sys *System, raw string) {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: bad", envChild, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := playRole(ctx, sys, spec, log)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "chaos: %s %s: %v\n", spec.Role, instance, err)
		os.Exit(3)
	}
	os.Exit(0)
}

func playRole(ctx context.Context, sys *System, spec childSpec, log *slog.Logger) error {
	db, err := openDB(spec.Stack, spec.DSN)
	if err != nil {
		return err
	}
	switch spec.Role {
	case roleProjector:
		return runProjector(ctx, db, spec, log)
	case roleConsumer:
		for _, g := range sys.Groups {
			if g.Name == spec.Group {
				return runConsumer(ctx, db, sys, g, spec, log)
			}
		}
		return fmt.Errorf("no group %q in the System", spec.Group)
	}
	return fmt.Errorf("no role %q", spec.Role)
}

func runProjector(ctx context.Context, db *gorm.DB, spec childSpec, log *slog.Logger) error {
	store, err := outbox.NewStore(db, nil)
	if err != nil {
		return err
	}
	var pub message.Publisher
	if spec.Stack == PostgresRabbitMQ {
		p, err := rabbitmq.NewPublisher(ctx, &rabbitmq.Config{URL: spec.AMQPURL, Exchange: spec.Exchange, Logger: log})
		if err != nil {
			return err
		}
		defer p.Close()
		pub = p
	} else {
		bus, err := dbbus.New(db, busConfig(log))
		if err != nil {
			return err
		}
		defer bus.Close()
		pub = bus
	}
	p, err := projector.New(store, pub, &projector.Config{Logger: log, WorkerID: instance, IdleSleep: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// busConfig is the database bus's configuration in a run: a visibility
// timeout of 10s (not 30s) so that the deliveries a killed process held
// come back, and a crash loop reaches its dead letter, within the
// settling time.
func busConfig(log *slog.Logger) *dbbus.Config {
	return &dbbus.Config{Logger: log, VisibilityTimeout: 10 * time.Second}
}

// consumerConfig is a group's consumer configuration in a run.
func consumerConfig(g Group, runID string, log *slog.Logger) *consumer.Config {
	cfg := consumer.DefaultConfig(groupName(g.Name, runID))
	cfg.Logger = log
	cfg.Partitions = g.Partitions
	if g.Partitions <= 0 {
		cfg.Partitions = -1
		cfg.Subscriptions = 2
	}
	cfg.RetryInitialInterval = 50 * time.Millisecond
	cfg.RetryMaxInterval = time.Second
	if g.Configure != nil {
		g.Configure(cfg)
	}
	return cfg
}

func runConsumer(ctx context.Context, db *gorm.DB, sys *System, g Group, spec childSpec, log *slog.Logger) error {
	cfg := consumerConfig(g, spec.RunID, log)
	var c *consumer.Consumer
	var err error
	if spec.Stack == PostgresRabbitMQ {
		c, err = consumer.NewAMQP(ctx, db, &rabbitmq.Config{URL: spec.AMQPURL, Exchange: spec.Exchange, Logger: log}, cfg)
	} else {
		var bus *dbbus.Bus
		bus, err = dbbus.New(db, busConfig(log))
		if err != nil {
			return err
		}
		defer bus.Close()
		c, err = consumer.NewDatabase(db, bus, cfg)
	}
	if err != nil {
		return err
	}
	units, err := newUnits(db, sys, nil)
	if err != nil {
		return err
	}
	if err := g.Register(c, &Env{DB: db, Units: units, Group: cfg.Group, Instance: instance}); err != nil {
		return err
	}
	return c.Run(ctx)
}
