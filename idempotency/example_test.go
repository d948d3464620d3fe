package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/uow"
)

// Order is what the example's command creates.
type Order struct {
	ID  uint `gorm:"primaryKey"`
	SKU string
}

func ExampleLedger_Middleware() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bento-idempotency")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := idempotency.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	_ = db.AutoMigrate(&Order{})
	// One client in this example, so one caller. An application with users
	// names each request's caller instead, with Config.Caller: the user's
	// or client's id, never the token it presents.
	ledger, err := idempotency.New(db, &idempotency.Config{SingleCaller: true})
	if err != nil {
		log.Fatal(err)
	}

	// The handler writes through the ledger's transaction (uow.DB), so the
	// order and the stored response commit together.
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		order := Order{SKU: string(body)}
		if err := uow.DB(r.Context(), db).Create(&order).Error; err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", order.ID))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"sku":%q}`, order.ID, order.SKU)
	})
	srv := httptest.NewServer(ledger.Middleware(createOrder))
	defer srv.Close()

	post := func(label string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("tea"))
		req.Header.Set(idempotency.HeaderKey, "7c9e6679-7425-40de-944b-e07fc1f90ae7")
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(label, resp.StatusCode, resp.Header.Get("Location"),
			"replayed="+resp.Header.Get(idempotency.HeaderReplayed), string(body))
	}
	post("first:")
	post("retry:") // the client timed out and sends the same request again

	var orders int64
	db.Model(&Order{}).Count(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// first: 201 /orders/1 replayed= {"id":1,"sku":"tea"}
	// retry: 201 /orders/1 replayed=true {"id":1,"sku":"tea"}
	// orders: 1
}
