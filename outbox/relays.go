package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/bentoevents/bento/internal/dialect"
)

// SetRelayIdle records whether the listening projector worker is idle
// (asleep, waiting for a notification) or busy (claiming full batches). On
// PostgreSQL the outbox trigger notifies on commit only while some
// projector is idle, which spares busy writers PostgreSQL's notification
// lock (see migration 004). On SQLite it does nothing.
//
// It only commits the worker's row; it never waits for writers. Once it
// returns with idle true, every outbox insert whose trigger runs later (in
// a READ COMMITTED transaction) notifies on commit. Inserts whose trigger
// ran earlier, in transactions still open, may have read the projector as
// busy and so may not notify: to see their events without a notification,
// the caller claims again once [Store.WritersOpen] has reported false. A
// projector calls SetRelayIdle with idle true before its first claim and
// before it sleeps after having been busy, and with idle false after a full
// batch.
//
// Errors: ErrInvalidClaim for an empty worker, or the database's error.
func (s *Store) SetRelayIdle(ctx context.Context, worker string, idle bool) error {
	if s.dialect != dialect.Postgres {
		return nil
	}
	if worker == "" {
		return fmt.Errorf("outbox: set relay idle: %w: empty worker", ErrInvalidClaim)
	}
	err := s.db.WithContext(ctx).Exec(setRelayIdleSQL, map[string]any{"worker": worker, "idle": idle}).Error
	if err != nil {
		return wrapDB("outbox: set relay idle", err)
	}
	return nil
}

// WritersOpen reports whether some transaction that inserted outbox rows
// (of the store's schema) is still open. It does not wait, and it never
// makes a writer wait more than the one statement it runs. On SQLite it
// reports false.
//
// It is the second half of going idle (see [Store.SetRelayIdle]): a false
// answer after SetRelayIdle(ctx, worker, true) returned proves that every
// writer that may have read the projector as busy has ended, so a claim
// made after it sees all their committed events; later writers notify. A
// true answer may also come from another projector's WritersOpen running at
// the same instant; ask again later, as for a writer still open.
//
// Run it on a Store over a connection pool, not inside a transaction, where
// the key it takes would stay held until that transaction ends.
func (s *Store) WritersOpen(ctx context.Context) (bool, error) {
	if s.dialect != dialect.Postgres {
		return false, nil
	}
	var open bool
	if err := s.db.WithContext(ctx).Raw(writersOpenSQL).Scan(&open).Error; err != nil {
		return false, wrapDB("outbox: writers open", err)
	}
	return open, nil
}

// RemoveRelay deletes the worker's row, when its projector stops. On SQLite
// it does nothing.
func (s *Store) RemoveRelay(ctx context.Context, worker string) error {
	if s.dialect != dialect.Postgres {
		return nil
	}
	if err := s.db.WithContext(ctx).Exec(removeRelaySQL, map[string]any{"worker": worker}).Error; err != nil {
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
	err := s.db.WithContext(ctx).Raw(relaysSQL).
		Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("outbox: relays", err)
	}
	for i := range rows {
		rows[i].ChangedAt = rows[i].ChangedAt.UTC()
	}
	return rows, nil
}
