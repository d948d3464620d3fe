package main

import (
	"context"
	"fmt"
	"log/slog"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// App holds what every minishop mode shares: the database, the unit-of-work
// manager, the bus and the metrics registry.
type App struct {
	db      *gorm.DB
	units   *uow.Manager
	bus     *bus
	log     *slog.Logger
	metrics *prometheus.Registry
	catalog order.Catalog
	// wake, when set, is called after commits (the in-process projector's
	// Wake on the embedded default).
	wake func()
	// consumers are the consumers this process runs, for /readyz.
	consumers []*consumer.Consumer
}

// newApp builds the App over db and b.
func newApp(db *gorm.DB, b *bus, log *slog.Logger) (*App, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a := &App{db: db, bus: b, log: log, metrics: reg, catalog: order.DefaultCatalog()}
	units, err := uow.New(db, &uow.Config{
		Producer:   "minishop",
		Registerer: reg,
		AfterCommit: func(int) {
			if a.wake != nil {
				a.wake()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	a.units = units
	return a, nil
}

// migrate creates every table minishop uses and seeds the stock of
// catalog's skus. It is idempotent and safe to run from several processes.
// It runs before newApp: bento's constructors check that their tables
// exist.
func migrate(ctx context.Context, db *gorm.DB, catalog order.Catalog) error {
	if err := outbox.Migrate(ctx, db); err != nil {
		return err
	}
	if err := inbox.Migrate(ctx, db); err != nil {
		return err
	}
	if err := idempotency.Migrate(ctx, db); err != nil {
		return err
	}
	if err := db.WithContext(ctx).AutoMigrate(&order.Order{}, &inventory.Stock{}, &inventory.Reservation{}, &Notification{}); err != nil {
		return fmt.Errorf("migrate minishop tables: %w", err)
	}
	skus := make([]string, 0, len(catalog))
	for sku := range catalog {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		s := &inventory.Stock{OnHand: inventory.SeedOnHand}
		s.ID, s.Version = sku, 1
		if err := db.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(s).Error; err != nil {
			return fmt.Errorf("seed stock %s: %w", sku, err)
		}
	}
	return nil
}
