package outbox

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// SetRelayIdle records whether the listening projector worker is idle
// (asleep, waiting for a notification) or busy (claiming full batches). On
// PostgreSQL the outbox trigger notifies on commit only while some
// projector is idle, which spares busy writers PostgreSQL's notification
// lock (see migration 004). On SQLite it does nothing.
//
// Going idle is a handshake: after the row is committed, SetRelayIdle waits
// until every writer that may have read the projector as busy has ended its
// transaction. So when it returns, the caller's next claim sees every event
// committed without a notification, and any event committed later notifies.
// A projector calls it with idle true before its first claim and before it
// sleeps after having been busy, and with idle false after a full batch.
func (s *Store) SetRelayIdle(ctx context.Context, worker string, idle bool) error {
	if s.dialect != dialect.Postgres {
		return nil
	}
	if worker == "" {
		return fmt.Errorf("outbox: set relay idle: %w: empty worker", ErrInvalidClaim)
	}
	err := s.db.WithContext(ctx).Exec(`INSERT INTO bento_outbox_relays (worker_id, idle, changed_at)
VALUES (?, ?, now())
ON CONFLICT (worker_id) DO UPDATE SET idle = EXCLUDED.idle, changed_at = EXCLUDED.changed_at`, worker, idle).Error
	if err != nil {
		return wrapDB("outbox: set relay idle", err)
	}
	if !idle {
		return nil
	}
	// The trigger holds this key shared from before it reads the relays
	// until its transaction ends; taking it exclusively waits them out.
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return tx.Exec(`SELECT pg_advisory_xact_lock(hashtext(n.nspname || '.bento_outbox_relays'))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = 'outbox_events'::regclass`).Error
	})
	if err != nil {
		return wrapDB("outbox: wait for writers", err)
	}
	return nil
}

// RemoveRelay deletes the worker's row, when its projector stops. On SQLite
// it does nothing.
func (s *Store) RemoveRelay(ctx context.Context, worker string) error {
	if s.dialect != dialect.Postgres {
		return nil
	}
	if err := s.db.WithContext(ctx).Exec(`DELETE FROM bento_outbox_relays WHERE worker_id = ?`, worker).Error; err != nil {
		return wrapDB("outbox: remove relay", err)
	}
	return nil
}

// Relay is a listening projector as it registered itself (SetRelayIdle).
type Relay struct {
	WorkerID string
	// Idle is true while the projector sleeps waiting for commits, false
	// while it works through full batches.
	Idle bool
	// ChangedAt is when Idle last changed (UTC).
	ChangedAt time.Time
}

// Relays lists the registered projectors by worker id: the running ones,
// and rows that projectors killed without stopping left behind. On SQLite
// it returns none.
func (s *Store) Relays(ctx context.Context) ([]Relay, error) {
	if s.dialect != dialect.Postgres {
		return nil, nil
	}
	var rows []Relay
	err := s.db.WithContext(ctx).Raw(`SELECT worker_id, idle, changed_at FROM bento_outbox_relays ORDER BY worker_id`).
		Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("outbox: relays", err)
	}
	for i := range rows {
		rows[i].ChangedAt = rows[i].ChangedAt.UTC()
	}
	return rows, nil
}
