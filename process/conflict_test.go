package process

import (
	"context"
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
