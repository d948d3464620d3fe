package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/outbox"
)

// OrderPaid is the event the example stores.
type OrderPaid struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

func ExampleStore_Add() {
	dir, err := os.MkdirTemp("", "bento-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := embedded.OpenSQLite(filepath.Join(dir, "bento.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()

	ctx := context.Background()
	if err := outbox.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.NewStore(db, nil)
	if err != nil {
		log.Fatal(err)
	}

	// Write the event in the same transaction as the change that caused it.
	paid := OrderPaid{OrderID: "o-42", Amount: 1250}
	opts := &outbox.AddOpts{DedupKey: "order-o-42-paid"}
	err = db.Transaction(func(tx *gorm.DB) error {
		// ... update the order in tx ...
		msg, err := store.Add(ctx, tx, "order.paid", paid, opts)
		if err != nil {
			return err
		}
		fmt.Println("added", msg.Topic, "for tenant", msg.TenantID, "with status", msg.Status)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// The same dedup key again: rejected, nothing written.
	err = db.Transaction(func(tx *gorm.DB) error {
		_, err := store.Add(ctx, tx, "order.paid", paid, opts)
		return err
	})
	fmt.Println("duplicate rejected:", errors.Is(err, outbox.ErrDuplicateKey))

	st, err := store.Stats(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range outbox.Statuses {
		fmt.Printf("%s: %d\n", s, st.Counts[s])
	}
	fmt.Println("pending:", st.Pending)

	// Output:
	// added order.paid for tenant default with status new
	// duplicate rejected: true
	// new: 1
	// publishing: 0
	// sent: 0
	// failed: 0
	// dead: 0
	// pending: 1
}
