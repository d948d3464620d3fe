package console_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/outbox"
)

// Mount the console under /ops/outbox/ next to an application's own routes.
func Example() {
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
	err = db.Transaction(func(tx *gorm.DB) error {
		_, err := store.Add(ctx, tx, "order.paid", map[string]any{"order_id": "o-42"}, nil)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// Read-write, payloads hidden: the defaults.
	con, err := console.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", http.StripPrefix("/ops/outbox", con))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	res, err := http.Get(srv.URL + "/ops/outbox/")
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(res.Status)
	fmt.Printf("new: %s\n", regexp.MustCompile(`id="count-new">(\d+)<`).FindSubmatch(body)[1])
	fmt.Printf("stylesheet: %s\n", regexp.MustCompile(`<link rel="stylesheet" href="([^"]+)"`).FindSubmatch(body)[1])
	// Output:
	// 200 OK
	// new: 1
	// stylesheet: ./static/console.css
}
