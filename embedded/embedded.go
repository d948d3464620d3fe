package embedded

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// DefaultPath is the SQLite file Open opens when Config names neither a
// path nor a database.
const DefaultPath = "bento.db"

// Config is what Open wires. A nil Config, or a zero field, means the
// documented default.
type Config struct {
	// Path is the SQLite file Open opens with OpenSQLite when DB is nil.
	// Defaults to DefaultPath in the working directory.
	Path string
	// DB, when set, is the database to use instead of a SQLite file:
	// PostgreSQL in production, say. Open does not close it. Defaults to
	// none.
	DB *gorm.DB
	// Publisher, when set, is where the projector publishes instead of the
	// database bus: RabbitMQ in production (rabbitmq.NewConfirmPublisher),
	// say. Stack.Bus and Stack.Memory are then nil and Close does not
	// close it. Defaults to none: the database bus on DB.
	Publisher message.Publisher
	// Memory, when true and Publisher is nil, makes the projector publish
	// to a new in-memory bus (Stack.Memory) instead of the database bus:
	// for unit tests and examples, since a crash loses whatever the
	// in-memory bus held. Defaults to false.
	Memory bool
	// Bus configures the database bus. Defaults to nil (its defaults).
	Bus *dbbus.Config
	// Outbox configures the outbox store. Defaults to nil (its defaults).
	Outbox *outbox.Config
	// Units configures the unit-of-work manager. Open sets its Outbox to
	// the stack's store and calls its AfterCommit, if any, after waking the
	// projector. Defaults to nil (its defaults).
	Units *uow.Config
	// Projector configures the projector. Defaults to nil (its defaults).
	Projector *projector.Config
}

// Stack is what Open wired: a database with bento's tables, the outbox
// store, a projector relaying it, a unit-of-work manager whose commits wake
// that projector, and (unless Config.Publisher was set) the bus the
// projector publishes to: the database bus on the same database, or with
// Config.Memory the in-memory bus. Run the projector (Projector.Run or
// Drain) and consumers of the bus (consumer.NewDatabase on Bus,
// consumer.NewMemory on Memory) yourself.
type Stack struct {
	// DB is the database.
	DB *gorm.DB
	// Bus is the database bus on DB the projector publishes to; nil when
	// Config.Publisher or Config.Memory was set.
	Bus *dbbus.Bus
	// Memory is the in-memory bus the projector publishes to when
	// Config.Memory was set; nil otherwise.
	Memory *messaging.MemoryBus
	// Outbox is the outbox store units of work write to and the projector
	// relays from.
	Outbox *outbox.Store
	// Units is the unit-of-work manager.
	Units *uow.Manager
	// Projector relays Outbox to the bus or Config.Publisher.
	Projector *projector.OutboxProjector

	closeDB bool
}

// Open opens the database (a SQLite file unless cfg.DB is set), creates
// bento's tables in it (outbox.Migrate, inbox.Migrate, idempotency.Migrate,
// and dbbus.Migrate for the database bus; each is idempotent), and wires
// the outbox store, the bus, the projector and the unit-of-work manager.
// Close the stack when done.
//
// Errors: those of OpenSQLite, the migrations, outbox.NewStore, dbbus.New
// (dbbus.ErrInvalidConfig), projector.New (projector.ErrInvalidConfig) and
// uow.New (uow.ErrInvalidConfig), wrapped.
func Open(ctx context.Context, cfg *Config) (*Stack, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	s := &Stack{DB: c.DB}
	if s.DB == nil {
		path := c.Path
		if path == "" {
			path = DefaultPath
		}
		db, err := OpenSQLite(path, nil)
		if err != nil {
			return nil, err
		}
		s.DB, s.closeDB = db, true
	}
	if err := s.wire(ctx, c); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// wire migrates s.DB and builds the rest of s from c.
func (s *Stack) wire(ctx context.Context, c Config) error {
	type migration struct {
		name string
		fn   func(context.Context, *gorm.DB) error
	}
	migrations := []migration{{"outbox", outbox.Migrate}, {"inbox", inbox.Migrate}, {"idempotency", idempotency.Migrate}}
	useDBBus := c.Publisher == nil && !c.Memory
	if useDBBus {
		migrations = append(migrations, migration{"dbbus", dbbus.Migrate})
	}
	for _, m := range migrations {
		if err := m.fn(ctx, s.DB); err != nil {
			return fmt.Errorf("embedded: migrate %s: %w", m.name, err)
		}
	}
	store, err := outbox.NewStore(s.DB, c.Outbox)
	if err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	s.Outbox = store
	pub := c.Publisher
	switch {
	case pub != nil:
	case c.Memory:
		s.Memory = messaging.NewMemoryBus()
		pub = s.Memory
	default:
		if s.Bus, err = dbbus.New(s.DB, c.Bus); err != nil {
			return fmt.Errorf("embedded: %w", err)
		}
		pub = s.Bus
	}
	if s.Projector, err = projector.New(store, pub, c.Projector); err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	var units uow.Config
	if c.Units != nil {
		units = *c.Units
	}
	units.Outbox = store
	wake, then := s.Projector.Wake, units.AfterCommit
	units.AfterCommit = func(events int) {
		wake()
		if then != nil {
			then(events)
		}
	}
	if s.Units, err = uow.New(s.DB, &units); err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	return nil
}

// Close closes the bus Open made (the database bus or the in-memory bus)
// and, when Open opened it, the database. It does not stop a running
// projector: cancel its context first.
func (s *Stack) Close() error {
	var errs []error
	if s.Bus != nil {
		errs = append(errs, s.Bus.Close())
	}
	if s.Memory != nil {
		errs = append(errs, s.Memory.Close())
	}
	if s.closeDB && s.DB != nil {
		if sqlDB, err := s.DB.DB(); err == nil {
			errs = append(errs, sqlDB.Close())
		}
	}
	return errors.Join(errs...)
}
