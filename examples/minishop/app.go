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
	// consumers are the consumers this process runs, for /readyz.
	consumers []*consumer.Consumer
	// checkout is the checkout process's timing.
	checkout checkoutConfig
}

// newRegistry returns the registry /metrics serves: bento's collectors
// register there, with Go's and the process's.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// newApp builds the App over db, whose units of work units runs, and b.
func newApp(db *gorm.DB, units *uow.Manager, b *bus, log *slog.Logger, reg *prometheus.Registry) *App {
	return &App{db: db, units: units, bus: b, log: log, metrics: reg, catalog: order.DefaultCatalog(),
		checkout: checkoutConfig{Window: defaultPaymentWindow, RetryInterval: defaultRetryInterval, Retries: defaultRetries}}
}

// Migrate creates minishop's own tables (bento's are created by
// embedded.Open) and seeds the catalog's stock. It is idempotent and safe to
// run from several processes.
func (a *App) Migrate(ctx context.Context) error {
	if err := a.db.WithContext(ctx).AutoMigrate(&order.Order{}, &inventory.Stock{}, &inventory.Reservation{}, &Notification{}, &Checkout{}); err != nil {
		return fmt.Errorf("migrate minishop tables: %w", err)
	}
	skus := make([]string, 0, len(a.catalog))
	for sku := range a.catalog {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		s := &inventory.Stock{OnHand: inventory.SeedOnHand}
		s.ID, s.Version = sku, 1
		if err := a.db.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(s).Error; err != nil {
			return fmt.Errorf("seed stock %s: %w", sku, err)
		}
	}
	return nil
}
