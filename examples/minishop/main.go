// Command minishop is bento's example shop: orders are placed, paid or
// cancelled over an HTTP API; every change commits with its domain events in
// the transactional outbox; a projector relays them; an inventory consumer
// reserves and releases stock and a notification consumer records one
// notification per paid order, each exactly once through the inbox.
//
// Usage:
//
//	go run ./examples/minishop [flags] [all|serve|relay|worker|migrate]
//
// With no DATABASE_URL and no AMQP_URL it runs on an embedded SQLite file
// (-db, default minishop.db) and the database bus (its queues are tables
// in that file), so it needs no services and loses nothing when killed.
// DATABASE_URL=postgres://... selects PostgreSQL, with the database bus in
// PostgreSQL (no broker), and AMQP_URL=amqp://... RabbitMQ instead of the
// database bus, with the topic exchange MINISHOP_EXCHANGE (default
// minishop.events). -lease shortens how long what a killed process held
// waits before it is taken over (bento's defaults: 10 to 30 s).
//
// A checkout process (package process) cancels an order not paid within
// -payment-window (reason payment_timeout); after a declined card it
// reminds the customer every -payment-retry-interval, -payment-retries
// times, then cancels (reason payment_declined). GET /orders/{id} shows
// the deadline as payment_due_at while the window is open.
//
// The HTTP API also serves the operator console (package console) at
// /console/: the outbox backlog, a chart of the relay's activity, and the
// dead letters with Requeue and Discard buttons (payloads hidden).
//
// Subcommands: all (the default: HTTP API, projector and consumers in one
// process), serve (HTTP API only), relay (projector only), worker (consumers
// only), migrate (create the tables and exit). Several relay and worker
// processes may run at once, on either bus. SIGINT and SIGTERM shut down
// gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/housekeeping"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// pgIdleConns is how many idle connections minishop keeps on PostgreSQL:
// enough for its four consumer groups' partition owners and workers.
const pgIdleConns = 64

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

var modes = map[string]bool{"all": true, "serve": true, "relay": true, "worker": true, "migrate": true}

// run parses args, runs the chosen mode until it ends or a signal arrives,
// and returns the exit code.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("minishop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "HTTP listen address")
	dbPath := fs.String("db", "minishop.db", "SQLite file used when DATABASE_URL is not set")
	var checkout checkoutConfig
	fs.DurationVar(&checkout.Window, "payment-window", defaultPaymentWindow, "how long a placed order waits for its payment before the checkout process cancels it (reason payment_timeout)")
	fs.DurationVar(&checkout.RetryInterval, "payment-retry-interval", defaultRetryInterval, "after a declined card, how often the customer is reminded to pay")
	fs.IntVar(&checkout.Retries, "payment-retries", defaultRetries, "how many reminders follow a declined card before the order is cancelled (reason payment_declined)")
	lease := fs.Duration("lease", 0, "how long what a killed process held (relay claims, bus deliveries, consumer partitions) waits before another process, or the restarted one, takes it over (0: bento's defaults)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: minishop [flags] [all|serve|relay|worker|migrate]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	mode := "all"
	if fs.NArg() > 0 {
		mode = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil { // flags after the subcommand
			return exitUsage
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "minishop: unexpected arguments %v\n", fs.Args())
			return exitUsage
		}
	}
	if !modes[mode] {
		fmt.Fprintf(stderr, "minishop: unknown subcommand %q\n", mode)
		fs.Usage()
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	dbURL, amqpURL := os.Getenv("DATABASE_URL"), os.Getenv("AMQP_URL")
	log.Info("minishop: "+describe(dbURL, amqpURL, *dbPath), "mode", mode)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *lease < 0 {
		fmt.Fprintf(stderr, "minishop: -lease %v is negative\n", *lease)
		return exitUsage
	}
	if checkout.Window <= 0 || checkout.RetryInterval <= 0 || checkout.Retries < 0 {
		fmt.Fprintf(stderr, "minishop: -payment-window and -payment-retry-interval must be positive, -payment-retries not negative\n")
		return exitUsage
	}
	if err := serve(ctx, log, mode, *addr, dbURL, amqpURL, *dbPath, *lease, checkout); err != nil {
		log.Error("minishop: stopped with an error", "err", err)
		return exitError
	}
	return exitOK
}

// describe says which database and bus minishop uses.
func describe(dbURL, amqpURL, path string) string {
	db := "embedded SQLite " + path
	if dbURL != "" {
		db = "PostgreSQL (DATABASE_URL)"
	}
	b := "the database bus (queues in the same database)"
	if amqpURL != "" {
		b = "RabbitMQ (AMQP_URL)"
	}
	msg := "using " + db + " and " + b
	if dbURL == "" {
		msg += "; set DATABASE_URL=postgres://... for PostgreSQL, and AMQP_URL=amqp://... for RabbitMQ"
	}
	return msg
}

// serve runs mode until ctx ends. A nonzero lease replaces bento's defaults
// for how long what a killed process held stays reserved: the relay's
// claims, the database bus's deliveries (its visibility timeout) and the
// consumers' partitions (their takeover time).
func serve(ctx context.Context, log *slog.Logger, mode, addr, dbURL, amqpURL, path string, lease time.Duration, checkout checkoutConfig) error {
	reg := newRegistry()
	cfg := &embedded.Config{
		Path:      path,
		Units:     &uow.Config{Producer: "minishop", Registerer: reg},
		Projector: &projector.Config{Logger: log, Registerer: reg, Lease: lease, PublishTimeout: lease / 2},
	}
	if dbURL != "" {
		db, err := gorm.Open(postgres.Open(dbURL), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		if err != nil {
			return fmt.Errorf("open database: %w", err)
		}
		if sqlDB, err := db.DB(); err == nil {
			defer sqlDB.Close()
			// Keep what the pool opens: with database/sql's default of two
			// idle connections, the partitions' owners and workers
			// reconnected all the time, and under load the connects timed
			// out and lapsed the consumers' memberships.
			sqlDB.SetMaxIdleConns(pgIdleConns)
		}
		cfg.DB = db
	}
	var b *bus
	if amqpURL != "" {
		var err error
		if b, err = openAMQP(ctx, log, amqpURL); err != nil {
			return fmt.Errorf("open bus: %w", err)
		}
		defer b.close()
		cfg.Publisher = b.pub
	} else {
		cfg.Bus = &dbbus.Config{VisibilityTimeout: lease, Logger: log}
	}
	// One call wires the database (bento's tables included), the outbox,
	// the projector and the units of work; with no broker also the
	// database bus, in the same database.
	stack, err := embedded.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer stack.Close()
	if b == nil {
		if b, err = databaseBus(ctx, stack.DB, stack.Bus); err != nil {
			return fmt.Errorf("open bus: %w", err)
		}
	}
	if lease > 0 {
		newConsumer := b.newConsumer
		b.newConsumer = func(db *gorm.DB, cfg *consumer.Config) (*consumer.Consumer, error) {
			cfg.TakeoverTime = lease
			return newConsumer(db, cfg)
		}
	}
	a := newApp(stack.DB, stack.Units, b, log, reg)
	a.checkout = checkout
	if err := a.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if mode == "migrate" {
		log.Info("minishop: migrated")
		return nil
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := func(name string, fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
				cancel() // one part failing stops the process
			}
		}()
	}
	if mode == "all" || mode == "worker" {
		for _, mk := range []func() (runner, error){a.inventoryRunner, a.orderingRunner, a.notificationRunner, a.checkoutRunner} {
			c, err := mk()
			if err != nil {
				return err
			}
			start(c.name, c.run)
		}
	}
	if mode == "all" || mode == "relay" {
		start("relay", stack.Projector.Run)
		// Retention and partition maintenance, one instance at a time. On
		// the database bus the stock.* events no group consumes are kept
		// as unroutable, and deleted after unroutableRetention.
		hk := &housekeeping.Config{DB: a.db, Logger: log, Registerer: a.metrics, Unroutable: b.amqp,
			ProcessTables: []string{checkoutTable}}
		if b.amqp == nil {
			hk.UnroutableRetention = unroutableRetention
		}
		start("housekeeping", func(ctx context.Context) error { return housekeeping.Run(ctx, hk) })
	}
	if mode == "all" || mode == "serve" {
		h, err := a.handler()
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		srv := newServer(h)
		log.Info("minishop: HTTP API listening", "addr", ln.Addr().String())
		start("http", func(ctx context.Context) error {
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	<-ctx.Done()
	log.Info("minishop: shutting down")
	wg.Wait()
	return errors.Join(errs...)
}
