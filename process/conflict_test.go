package process

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

type counting struct {
	Base
	N int
}

func conflictManager(t *testing.T, db *gorm.DB) *Manager[counting, *counting] {
	t.Helper()
	require.NoError(t, outbox.Migrate(context.Background(), db))
	require.NoError(t, db.AutoMigrate(&counting{}))
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	return &Manager[counting, *counting]{cfg: Config{Name: "count", Outbox: store}, log: nopLog()}
}

func nopLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// step runs one step that adds 1 to the process's count in tx.
func step(m *Manager[counting, *counting], tx *gorm.DB, id string) error {
	env := &messaging.Envelope{ID: id, EventType: "count.add", TenantID: "default"}
	return m.run(context.Background(), tx, env, "p-1", "", true, Ignore, func(s *Step[counting]) error {
		s.State.N++
		return nil
	})
}

// TestConcurrentStepsConflict: on PostgreSQL two steps of one process that
// race (two starts, then two updates of the version both read) cannot both
// commit: the second fails with ErrConflict, as a transient failure the
// consumer retries in place, and no step is lost once it is retried.
func TestConcurrentStepsConflict(t *testing.T) {
	db, _ := testenv.Postgres(t)
	m := conflictManager(t, db)
	for _, phase := range []string{"start", "update"} {
		t.Run(phase, func(t *testing.T) {
			first := db.Begin()
			require.NoError(t, step(m, first, phase+"-1"))
			second := make(chan error, 1)
			go func() {
				tx := db.Begin()
				err := step(m, tx, phase+"-2")
				if err == nil {
					err = tx.Commit().Error
				} else {
					tx.Rollback()
				}
				second <- err
			}()
			select {
			case err := <-second:
				t.Fatalf("the second step finished (%v) while the first was open", err)
			case <-time.After(300 * time.Millisecond): // it waits for the first's row lock
			}
			require.NoError(t, first.Commit().Error)
			err := <-second
			require.ErrorIs(t, err, ErrConflict)
			assert.True(t, consumer.IsTransient(err), "retried in place: %v", err)

			require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return step(m, tx, phase+"-2") }), "the retry")
		})
	}
	var c counting
	require.NoError(t, db.Take(&c).Error)
	assert.Equal(t, 4, c.N, "every step applied once")
	assert.Equal(t, int64(4), c.Version)
}

// TestPurgeOnEveryBackend: Purge's batched DELETE (a row-value IN over a
// limited subquery) deletes exactly the expired tombstones on each
// database, batch after batch.
func TestPurgeOnEveryBackend(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		require.NoError(t, db.AutoMigrate(&counting{}))
		now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
		old, recent := now.Add(-48*time.Hour), now.Add(-time.Hour)
		var rows []counting
		for i := range 25 {
			c := counting{Base: Base{TenantID: "default", Key: fmt.Sprint("k", i), Process: "count", StartedAt: old, UpdatedAt: old}}
			switch i % 5 {
			case 0: // running
			case 1:
				c.Completed, c.CompletedAt = true, &recent
			default: // 15 expired
				c.Completed, c.CompletedAt = true, &old
			}
			if i == 24 {
				c.TenantID = "other"
			}
			rows = append(rows, c)
		}
		require.NoError(t, db.Create(&rows).Error)
		clock := func() time.Time { return now }
		n, err := Purge(context.Background(), db, "countings", 24*time.Hour, &PurgeOpts{Now: clock, Tenant: "other"})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the other tenant's one")
		n, err = Purge(context.Background(), db, "countings", 24*time.Hour, &PurgeOpts{Now: clock, Batch: 4})
		require.NoError(t, err)
		assert.Equal(t, int64(14), n, "the rest of the expired, in four batches")
		var left []counting
		require.NoError(t, db.Order("process_key").Find(&left).Error)
		assert.Len(t, left, 10)
		for _, c := range left {
			assert.True(t, !c.Completed || c.CompletedAt.Equal(recent), "%s kept: running or completed recently", c.Key)
		}
	})
}
