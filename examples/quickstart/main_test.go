package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/internal/testenv"
)

// requireStory checks what the program printed and wrote: the placed
// event waited while publishing failed, then both events were sent and
// each applied exactly once.
func requireStory(t *testing.T, out string, db *gorm.DB) {
	t.Helper()
	t.Log(out)
	assert.Regexp(t, `outbox: order.placed v1 failed after 1 failed attempts \(quickstart: the broker is unplugged\)`, out)
	placed := strings.Index(out, "outbox: order.placed v1 sent")
	paid := strings.Index(out, "outbox: order.paid v2 sent")
	require.True(t, placed > 0 && paid > placed, "both events sent, in version order")
	assert.Len(t, regexp.MustCompile(`(?m)^notification: order \w+ placed: 1250 cents$`).FindAllString(out, -1), 1)
	assert.Len(t, regexp.MustCompile(`(?m)^notification: order \w+ paid: 1250 cents$`).FindAllString(out, -1), 1)

	var notes, inboxRows int64
	require.NoError(t, db.Model(&Notification{}).Count(&notes).Error)
	require.NoError(t, db.Table("inbox_messages").Count(&inboxRows).Error)
	assert.EqualValues(t, 2, notes, "each event applied once")
	assert.EqualValues(t, 2, inboxRows, "each event recorded once in the inbox")
	var o Order
	require.NoError(t, db.First(&o).Error)
	assert.Equal(t, "paid", o.Status)
	assert.EqualValues(t, 2, o.Version)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestQuickstartOnTheEmbeddedDefault(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "quickstart.db")
	var out bytes.Buffer
	cfg := config{DBPath: path, Group: "quickstart.notification", BreakFor: time.Second, Log: quiet()}
	require.NoError(t, run(context.Background(), cfg, &out))

	db, err := embedded.OpenSQLite(path, nil)
	require.NoError(t, err)
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	requireStory(t, out.String(), db)
}

func TestQuickstartOnPostgresAndRabbitMQ(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	ex := testenv.NewExchange(t)
	group := ex.Name + ".notification"
	ex.Partitioned(group, consumer.DefaultPartitions) // deleted at cleanup
	var out bytes.Buffer
	cfg := config{DatabaseURL: dsn, AMQPURL: ex.URL, Exchange: ex.Name, Group: group, BreakFor: time.Second, Log: quiet()}
	require.NoError(t, run(context.Background(), cfg, &out))
	requireStory(t, out.String(), db)
}

// TestQuickstartOnPostgresWithoutBroker runs the quickstart with
// DATABASE_URL and no AMQP_URL: the database bus in PostgreSQL.
func TestQuickstartOnPostgresWithoutBroker(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	var out bytes.Buffer
	cfg := config{DatabaseURL: dsn, Group: "quickstart.notification", BreakFor: time.Second, Log: quiet()}
	require.NoError(t, run(context.Background(), cfg, &out))
	requireStory(t, out.String(), db)
	var queued int64
	require.NoError(t, db.Table("dbbus_deliveries").Count(&queued).Error)
	assert.Zero(t, queued, "both events went through the database bus and were acknowledged")
}

// TestPlaceOrderRefusesABadTotal shows the aggregate validating before it
// records: nothing is pending after a refusal.
func TestPlaceOrderRefusesABadTotal(t *testing.T) {
	t.Parallel()
	o, err := PlaceOrder("o1", "c1", 0)
	assert.ErrorIs(t, err, ErrBadTotal)
	assert.Nil(t, o)

	o, err = PlaceOrder("o1", "c1", 100)
	require.NoError(t, err)
	require.NoError(t, o.Pay())
	assert.ErrorIs(t, o.Pay(), ErrNotPayable, "paying twice")
	assert.Len(t, o.PendingEvents(), 2)
}
