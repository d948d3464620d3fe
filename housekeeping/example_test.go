package housekeeping_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/housekeeping"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/outbox"
)

// Run purges what retention allows, at once and then every Every, until
// its context ends: here an inbox record older than the 30-day default.
func ExampleRun() {
	dir, _ := os.MkdirTemp("", "housekeeping")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, migrate := range []func(context.Context, *gorm.DB) error{outbox.Migrate, inbox.Migrate, idempotency.Migrate} {
		if err := migrate(ctx, db); err != nil {
			panic(err)
		}
	}
	old := inbox.Record{Consumer: "billing", MessageID: "m1", TenantID: "default", ReceivedAt: time.Now().AddDate(0, 0, -40)}
	if err := db.Create(&old).Error; err != nil {
		panic(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- housekeeping.Run(runCtx, &housekeeping.Config{DB: db, Every: time.Hour}) }()
	var left int64 = 1
	for left > 0 {
		time.Sleep(10 * time.Millisecond)
		db.Model(&inbox.Record{}).Count(&left)
	}
	stop()
	fmt.Println("inbox records left:", left, "error:", <-done)
	// Output: inbox records left: 0 error: <nil>
}
