// Command quickstart is the whole program docs/getting-started.md builds, in
// one file: an Order aggregate that records events, a unit of work that
// commits the order and its events together, a notification consumer that
// applies each event exactly once, and a projector that relays the outbox.
//
// It places and pays one order, then waits until the consumer has applied
// both events. With DATABASE_URL and AMQP_URL set it runs on PostgreSQL and
// RabbitMQ; without, on a SQLite file and the database bus (queues in that
// file); with DATABASE_URL alone, on PostgreSQL and the database bus:
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -break-publishing 5s
//
// -break-publishing makes every publish fail for a while, as an unplugged
// broker would: the paid event waits in the outbox, is retried with backoff,
// and arrives once publishing works again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// Order is an aggregate: a GORM model that embeds aggregate.Base and
// records what happens to it as events.
type Order struct {
	aggregate.Base
	CustomerID string
	Status     string
	TotalCents int64
}

// AggregateType names the kind of aggregate on every event it records.
func (*Order) AggregateType() string { return "order" }

// OrderPlaced is recorded when an order is created.
type OrderPlaced struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	TotalCents int64  `json:"total_cents"`
}

// EventType is the event's topic and routing key.
func (OrderPlaced) EventType() string { return "order.placed" }

// OrderPaid is recorded when an order is paid.
type OrderPaid struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// EventType is the event's topic and routing key.
func (OrderPaid) EventType() string { return "order.paid" }

// Errors of the Order aggregate.
var (
	ErrBadTotal   = errors.New("quickstart: an order's total must be positive")
	ErrNotPayable = errors.New("quickstart: only a placed order can be paid")
)

// PlaceOrder creates an order. A new aggregate records its first event
// like any other; the unit of work that adds it writes both.
func PlaceOrder(id, customerID string, totalCents int64) (*Order, error) {
	if totalCents <= 0 {
		return nil, fmt.Errorf("%w: %d", ErrBadTotal, totalCents)
	}
	o := &Order{CustomerID: customerID, Status: "placed", TotalCents: totalCents}
	o.ID = id
	o.Record(OrderPlaced{OrderID: id, CustomerID: customerID, TotalCents: totalCents})
	return o, nil
}

// Pay validates the change, applies it and records the fact. It touches
// no database and sends nothing.
func (o *Order) Pay() error {
	if o.Status != "placed" {
		return fmt.Errorf("%w: order %s is %s", ErrNotPayable, o.ID, o.Status)
	}
	o.Status = "paid"
	o.Record(OrderPaid{OrderID: o.ID, AmountCents: o.TotalCents})
	return nil
}

// Notification is what the consumer writes for each event it applies.
type Notification struct {
	EventID string `gorm:"primaryKey;size:64"`
	OrderID string `gorm:"index;size:64"`
	Text    string
}

// config is what main reads from flags and the environment.
type config struct {
	DatabaseURL string        // PostgreSQL; empty: the SQLite file at DBPath
	DBPath      string        // the SQLite file
	AMQPURL     string        // RabbitMQ; empty: the database bus
	Exchange    string        // RabbitMQ's topic exchange
	Group       string        // the consumer group (and its queue)
	BreakFor    time.Duration // how long publishing fails at first
	Log         *slog.Logger  // the consumer's and projector's logs
}

func main() {
	cfg := config{DatabaseURL: os.Getenv("DATABASE_URL"), AMQPURL: os.Getenv("AMQP_URL")}
	flag.StringVar(&cfg.DBPath, "db", "quickstart.db", "SQLite file, when DATABASE_URL is not set")
	flag.StringVar(&cfg.Exchange, "exchange", "quickstart.events", "RabbitMQ exchange, when AMQP_URL is set")
	flag.StringVar(&cfg.Group, "group", "quickstart.notification", "consumer group and queue name")
	flag.DurationVar(&cfg.BreakFor, "break-publishing", 0, "make every publish fail for this long")
	flag.Parse()
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// openDB opens PostgreSQL, or the SQLite file with the settings bento
// needs (embedded.OpenSQLite): WAL, a busy timeout, and transactions that
// take the write lock when they begin. With SQLite's default (deferred)
// transactions, two units of work that read and then write fail with
// SQLITE_BUSY instead of waiting for each other.
func openDB(cfg config) (*gorm.DB, error) {
	quiet := &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)}
	if cfg.DatabaseURL != "" {
		return gorm.Open(postgres.Open(cfg.DatabaseURL), quiet)
	}
	return embedded.OpenSQLite(cfg.DBPath, quiet)
}

// bus is where the projector publishes and the consumer reads.
type bus struct {
	pub         message.Publisher
	newConsumer func(db *gorm.DB, cc *consumer.Config) (*consumer.Consumer, error)
}

// openBus declares the consumer group's partition queues before anything
// is published, so no event is relayed while the group has nowhere to
// receive it. Without a broker the bus is the database bus, in db: its
// queues are tables, so nothing relayed is lost if the process dies.
// Event types no group consumes are kept aside: the database bus keeps
// them in dbbus.UnroutableGroup, as bento's alternate exchange does on
// RabbitMQ.
func openBus(ctx context.Context, cfg config, db *gorm.DB, topics ...string) (*bus, func(), error) {
	if cfg.AMQPURL == "" {
		if err := dbbus.Migrate(ctx, db); err != nil {
			return nil, nil, err
		}
		if err := dbbus.DeclarePartitions(ctx, db, cfg.Group, consumer.DefaultPartitions, topics...); err != nil {
			return nil, nil, err
		}
		dbb, err := dbbus.New(db, &dbbus.Config{Logger: cfg.Log})
		if err != nil {
			return nil, nil, err
		}
		return &bus{pub: dbb, newConsumer: func(db *gorm.DB, cc *consumer.Config) (*consumer.Consumer, error) {
			return consumer.NewDatabase(db, dbb, cc)
		}}, func() { _ = dbb.Close() }, nil
	}
	amqpCfg := &rabbitmq.Config{URL: cfg.AMQPURL, Exchange: cfg.Exchange, Logger: cfg.Log}
	if err := consumer.Declare(ctx, amqpCfg, &consumer.Config{Group: cfg.Group}, topics...); err != nil {
		return nil, nil, err
	}
	pub, err := rabbitmq.NewConfirmPublisher(ctx, amqpCfg)
	if err != nil {
		return nil, nil, err
	}
	return &bus{pub: pub, newConsumer: func(db *gorm.DB, cc *consumer.Config) (*consumer.Consumer, error) {
		return consumer.NewAMQP(ctx, db, amqpCfg, cc)
	}}, func() { _ = pub.Close() }, nil
}

// errUnplugged is what the broken publisher returns.
var errUnplugged = errors.New("quickstart: the broker is unplugged")

// breakable fails every publish for its first breakFor, counted from the
// first publish, as a broker that cannot be reached would: however long
// the order takes to commit, the first attempt fails.
type breakable struct {
	message.Publisher
	breakFor time.Duration
	mu       sync.Mutex
	until    time.Time // set by the first Publish
}

func (b *breakable) Publish(topic string, msgs ...*message.Message) error {
	b.mu.Lock()
	if b.until.IsZero() {
		b.until = time.Now().Add(b.breakFor)
	}
	broken := time.Now().Before(b.until)
	b.mu.Unlock()
	if broken {
		return errUnplugged
	}
	return b.Publisher.Publish(topic, msgs...)
}

// run wires everything in the safe order (tables, the group's queue, the
// consumer, then the projector), places and pays an order, and waits until
// both events are applied.
func run(ctx context.Context, cfg config, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	// 1. The database, the group's queues, then bento's tables, the outbox,
	// the units of work and the projector, wired by one call. On SQLite
	// nothing announces a commit, so the units wake the projector.
	db, err := openDB(cfg)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	b, closeBus, err := openBus(ctx, cfg, db, "order.placed", "order.paid")
	if err != nil {
		return fmt.Errorf("open bus: %w", err)
	}
	defer closeBus()
	pcfg := &projector.Config{BackoffFloor: 500 * time.Millisecond, Logger: cfg.Log}
	brk := &breakable{Publisher: b.pub, breakFor: cfg.BreakFor}
	stack, err := embedded.Open(ctx, &embedded.Config{DB: db, Publisher: brk, Projector: pcfg})
	if err != nil {
		return err
	}
	defer stack.Close()
	units := stack.Units
	if err := db.WithContext(ctx).AutoMigrate(&Order{}, &Notification{}); err != nil {
		return err
	}

	// 2. The consumer: it applies each event once, in one transaction with
	// its inbox record.
	c, err := b.newConsumer(db, &consumer.Config{Group: cfg.Group, Logger: cfg.Log})
	if err != nil {
		return err
	}
	// Each handler receives tx, the inbox transaction: what it writes
	// through tx commits with the inbox record, exactly once.
	notify := func(tx *gorm.DB, env *messaging.Envelope, orderID, text string) error {
		n := Notification{EventID: env.ID, OrderID: orderID, Text: text}
		return tx.Create(&n).Error
	}
	if err := consumer.Handle(c, func(_ context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
		return notify(tx, env, e.OrderID, fmt.Sprintf("order %s placed: %d cents", e.OrderID, e.TotalCents))
	}); err != nil {
		return err
	}
	if err := consumer.Handle(c, func(_ context.Context, tx *gorm.DB, e OrderPaid, env *messaging.Envelope) error {
		return notify(tx, env, e.OrderID, fmt.Sprintf("order %s paid: %d cents", e.OrderID, e.AmountCents))
	}); err != nil {
		return err
	}
	// Stop the consumer and the projector before the bus and the database
	// close (deferred calls run last first).
	var running sync.WaitGroup
	defer running.Wait()
	defer cancel()
	consumed := make(chan error, 1)
	running.Go(func() { consumed <- c.Run(ctx) })
	select {
	case <-c.Running():
	case err := <-consumed:
		return fmt.Errorf("consumer: %w", err)
	}

	// 3. The projector relays what was committed, from now on.
	relayed := make(chan error, 1)
	running.Go(func() { relayed <- stack.Projector.Run(ctx) })
	if cfg.BreakFor > 0 {
		fmt.Fprintf(out, "publishing fails for %v from the first attempt\n", cfg.BreakFor)
	}

	// 4. Commands: each commits the order and its events together.
	o, err := PlaceOrder(aggregate.NewID(), "c-42", 1250)
	if err != nil {
		return err
	}
	if err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(o) }); err != nil {
		return fmt.Errorf("place: %w", err)
	}
	fmt.Fprintf(out, "placed order %s\n", o.ID)
	if err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		o, err := uow.Get[Order](ctx, u, o.ID)
		if err != nil {
			return err
		}
		return o.Pay()
	}); err != nil {
		return fmt.Errorf("pay: %w", err)
	}
	fmt.Fprintf(out, "paid order %s\n", o.ID)

	// 5. Watch the order's two events in the outbox until they are sent,
	// then wait for the consumer.
	const events = 2
	if err := watch(ctx, db, o, events, out); err != nil {
		return err
	}
	var notes []Notification
	for len(notes) < events {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the consumer: %w", ctx.Err())
		case err := <-consumed:
			return fmt.Errorf("consumer stopped: %w", err)
		case err := <-relayed:
			return fmt.Errorf("projector stopped: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := db.WithContext(ctx).Where("order_id = ?", o.ID).Order("event_id").Find(&notes).Error; err != nil {
			return err
		}
	}
	for _, n := range notes {
		fmt.Fprintf(out, "notification: %s\n", n.Text)
	}
	return nil
}

// watch prints each change of state of the outbox rows of the first n
// events of o (an aggregate's events are its versions 1, 2, ...) until all
// of them are sent.
func watch(ctx context.Context, db *gorm.DB, o *Order, n int, out io.Writer) error {
	last := map[int64]string{}
	for {
		var rows []outbox.Message
		err := db.WithContext(ctx).Where("aggregate_type = ? AND aggregate_id = ? AND aggregate_version <= ?",
			o.AggregateType(), o.ID, n).Order("aggregate_version").Find(&rows).Error
		if err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		sent := 0
		for _, m := range rows {
			state := string(m.Status)
			if m.LastError != nil && m.Status != outbox.StatusSent {
				state = fmt.Sprintf("%s after %d failed attempts (%s)", m.Status, m.Attempts, *m.LastError)
			}
			if state != last[m.AggregateVersion] {
				fmt.Fprintf(out, "outbox: %s v%d %s\n", m.Topic, m.AggregateVersion, state)
				last[m.AggregateVersion] = state
			}
			if m.Status == outbox.StatusSent {
				sent++
			}
		}
		if sent == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the outbox: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
