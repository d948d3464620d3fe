package inbox_test

import (
	"context"
	"crypto/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/fakeclock"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// The behavioural suites of this package also run on partitioned tables.
func init() {
	testenv.PartitionTables(func(t testing.TB, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, outbox.MigrateWith(ctx, db, &partition.MigrateOpts{Partitioning: partition.Daily}))
		require.NoError(t, inbox.MigrateWith(ctx, db, &partition.MigrateOpts{Partitioning: partition.Daily}))
	})
}

// inboxPartitionOf returns the partition holding consumer's record of id.
func inboxPartitionOf(t *testing.T, db *gorm.DB, consumer, id string) string {
	t.Helper()
	var name string
	require.NoError(t, db.Raw("SELECT tableoid::regclass::text FROM inbox_messages WHERE consumer = ? AND message_id = ?",
		consumer, id).Scan(&name).Error)
	return name
}

func TestPartitionedInboxDedupAndRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nov1 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	db, _ := testenv.Postgres(t)
	require.NoError(t, inbox.MigrateWith(ctx, db, &partition.MigrateOpts{
		Partitioning: partition.Daily, Ahead: 10, Clock: fakeclock.New(nov1),
	}))
	require.NoError(t, db.AutoMigrate(&Effect{}))
	in, err := inbox.New(db, &inbox.Config{Consumer: "billing", Clock: testenv.NewClock(nov1.AddDate(0, 0, 5))})
	require.NoError(t, err)
	e := &env{db: db, in: in}
	var calls atomic.Int32
	h := in.Middleware(writeEffect(&calls))

	// Message ids as the outbox makes them: ULIDs of when the event was
	// created. A redelivery days later is still a duplicate: its record
	// lives in the partition of the id, not of the delivery time.
	nov2 := ulid.MustNew(ulid.Timestamp(nov1.AddDate(0, 0, 1).Add(3*time.Hour)), rand.Reader).String()
	nov4 := ulid.MustNew(ulid.Timestamp(nov1.AddDate(0, 0, 3).Add(3*time.Hour)), rand.Reader).String()
	for _, id := range []string{nov2, nov4, "not-a-ulid", nov2, nov4, "not-a-ulid"} {
		_, err := h(newMsg(id))
		require.NoError(t, err)
	}
	assert.EqualValues(t, 3, calls.Load(), "each message applied once")
	assert.Equal(t, "inbox_messages_p20261102", inboxPartitionOf(t, db, "billing", nov2))
	assert.Equal(t, "inbox_messages_p20261104", inboxPartitionOf(t, db, "billing", nov4))
	assert.Equal(t, "inbox_messages_default", inboxPartitionOf(t, db, "billing", "not-a-ulid"))

	// Retention: with 5 days, on Nov 8 the Nov 2 partition goes (its
	// range ended Nov 3), the Nov 4 one stays.
	plan, err := inbox.Maintain(ctx, db, &partition.MaintainOpts{
		Retention: 5 * 24 * time.Hour, Clock: fakeclock.New(nov1.AddDate(0, 0, 7)), DryRun: true,
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"inbox_messages_p20261101", "inbox_messages_p20261102"}, plan.Dropped)
	assert.Equal(t, "inbox_messages_p20261102", inboxPartitionOf(t, db, "billing", nov2), "a dry run drops nothing")
	res, err := inbox.Maintain(ctx, db, &partition.MaintainOpts{
		Retention: 5 * 24 * time.Hour, Clock: fakeclock.New(nov1.AddDate(0, 0, 7)),
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"inbox_messages_p20261101", "inbox_messages_p20261102"}, res.Dropped)
	assert.Equal(t, plan.Created, res.Created)
	assert.Contains(t, res.Created, "inbox_messages_p20261115")
	ok, err := in.Processed(ctx, nov2)
	require.NoError(t, err)
	assert.False(t, ok, "the record went with its partition: the dedup window is the retention")
	for _, id := range []string{nov4, "not-a-ulid"} {
		ok, err := in.Processed(ctx, id)
		require.NoError(t, err)
		assert.True(t, ok, id)
	}
	_, err = h(newMsg(nov4))
	require.NoError(t, err)
	assert.EqualValues(t, 3, calls.Load(), "still a duplicate after maintenance")
	assert.Equal(t, int64(3), e.count(t, &Effect{}, ""))
}

func TestPartitionedInboxErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	daily := &partition.MigrateOpts{Partitioning: partition.Daily}
	require.ErrorIs(t, inbox.MigrateWith(ctx, testenv.SQLite(t), daily), partition.ErrUnsupported)

	plain, _ := testenv.Postgres(t)
	require.NoError(t, inbox.Migrate(ctx, plain))
	require.ErrorIs(t, inbox.MigrateWith(ctx, plain, daily), partition.ErrNotPartitioned)
	_, err := inbox.Maintain(ctx, plain, nil)
	require.ErrorIs(t, err, partition.ErrNotPartitioned)
}
