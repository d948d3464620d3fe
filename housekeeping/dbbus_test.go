package housekeeping_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/housekeeping"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestBusUnroutableRetention keeps two unroutable messages on the database
// bus, one published two hours ago: with UnroutableRetention of an hour,
// the job must delete the old one and keep the young one.
func TestBusUnroutableRetention(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		require.NoError(t, dbbus.Migrate(ctx, db))
		bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		old := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		require.NoError(t, bus.Publish("stock.reserved", old))
		var at any = time.Now().Add(-2 * time.Hour) // a timestamptz on PostgreSQL
		if db.Dialector.Name() == "sqlite" {
			at = time.Now().UTC().Add(-2 * time.Hour).Format("2006-01-02 15:04:05") // CURRENT_TIMESTAMP's text
		}
		require.NoError(t, db.Exec(`UPDATE dbbus_messages SET created_at = ? WHERE id = ?`, at, old.UUID).Error)
		require.NoError(t, bus.Publish("stock.reserved", message.NewMessage(watermill.NewUUID(), []byte(`{}`))))

		_, names, err := housekeeping.Prepare(&housekeeping.Config{DB: db, UnroutableRetention: time.Hour,
			OutboxRetention: -1, InboxRetention: -1, KeepIdempotencyKeys: true})
		require.NoError(t, err)
		assert.Equal(t, []string{housekeeping.JobBusUnroutablePurge}, names)
		reg := prometheus.NewRegistry()
		start(t, &housekeeping.Config{DB: db, Every: 50 * time.Millisecond, UnroutableRetention: time.Hour,
			OutboxRetention: -1, InboxRetention: -1, KeepIdempotencyKeys: true, Registerer: reg})
		testenv.WaitFor(t, 20*time.Second, "the old unroutable message purged", func() bool {
			n, err := dbbus.Depth(ctx, db, dbbus.UnroutableGroup)
			require.NoError(t, err)
			return n == 1
		})
		testenv.WaitFor(t, 20*time.Second, "the job counted", func() bool {
			return counter(t, reg, "bento_housekeeping_rows_total", task(housekeeping.JobBusUnroutablePurge)) == 1
		})
		n, err := dbbus.Depth(ctx, db, dbbus.UnroutableGroup)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "the young message is kept")
	})
}
