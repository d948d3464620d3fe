package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/instance"
)

// ErrPartitionMismatch is returned by Run when another live instance of the
// group runs with a different partition count.
var ErrPartitionMismatch = errors.New("consumer: instances of the group disagree on the partition count")

// members is one instance's view of its group's membership, kept in the
// consumer_members table (inbox migration 003): each instance renews a row
// that expires ttl later on the database's clock, and the group's
// partitions are dealt round-robin among the live rows in member_id order,
// so every instance computes the same assignment from the same rows.
//
// A membership lasts from the beat that inserts the row to its expiry or
// deletion; gen counts them. What a partition worker commits is fenced by
// the membership it was started under (see fence), so an instance whose
// row expired (it froze, or lost the database) commits nothing that its
// peers may have taken over meanwhile, even after it has joined again.
type members struct {
	db         *gorm.DB
	postgres   bool
	now        string // SQL for the database's clock in milliseconds
	group, id  string
	partitions int
	gen        atomic.Int64 // the current membership; 0 before the first beat
}

func newMembers(db *gorm.DB, group string, partitions int) (*members, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	// Two consumers of a group in one process are two members.
	return &members{db: db, postgres: d == dialect.Postgres, now: nowMillis(d), group: group, id: instance.ID(),
		partitions: partitions}, nil
}

// nowMillis is the SQL for the clock of a database of dialect d, in
// milliseconds since 1970: the clock of consumer_members.expires_ms.
func nowMillis(d dialect.Dialect) string {
	if d == dialect.SQLite {
		return `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`
	}
	return `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`
}

// beat forgets expired members, renews this member's row for ttlMillis
// (joining again, as a new membership, when the row had expired or was
// gone) and returns the partitions this member owns now. Each statement,
// and the whole beat, is bounded by timeout: a database that hangs fails
// the beat instead of stopping the membership loop.
//
// Errors: ErrPartitionMismatch, or the database's error.
func (m *members) beat(ctx context.Context, ttlMillis int64, timeout time.Duration) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var owned []int
	err := m.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := m.bound(tx, timeout); err != nil {
			return err
		}
		if err := tx.Exec(`DELETE FROM consumer_members WHERE consumer = ? AND expires_ms < `+m.now, m.group).Error; err != nil {
			return err
		}
		renew := tx.Exec(`UPDATE consumer_members SET partitions = ?, expires_ms = `+m.now+` + ?
WHERE consumer = ? AND member_id = ?`, m.partitions, ttlMillis, m.group, m.id)
		if renew.Error != nil {
			return renew.Error
		}
		if renew.RowsAffected == 0 {
			if err := tx.Exec(`INSERT INTO consumer_members (consumer, member_id, partitions, expires_ms)
VALUES (?, ?, ?, `+m.now+` + ?)`, m.group, m.id, m.partitions, ttlMillis).Error; err != nil {
				return err
			}
			// A new membership, before the commit that makes it visible:
			// a fence that sees the row sees the new generation too.
			m.gen.Add(1)
		}
		var rows []struct {
			MemberID   string
			Partitions int
		}
		if err := tx.Raw(`SELECT member_id, partitions FROM consumer_members WHERE consumer = ? ORDER BY member_id`,
			m.group).Scan(&rows).Error; err != nil {
			return err
		}
		ids := make([]string, 0, len(rows))
		for _, r := range rows {
			if r.Partitions != m.partitions {
				return fmt.Errorf("%w: %s runs %d partitions of %s, this instance %d",
					ErrPartitionMismatch, r.MemberID, r.Partitions, m.group, m.partitions)
			}
			ids = append(ids, r.MemberID)
		}
		owned = assign(m.partitions, ids, m.id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: membership of %s: %w", m.group, err)
	}
	return owned, nil
}

// bound sets, on PostgreSQL, the lock timeout and the idle-in-transaction
// session timeout of transaction tx to d: a lock wait longer than d fails,
// and a session that stays idle inside tx for longer than d (its process
// stopped, its connection lost) is ended by the server, which rolls tx back
// and frees its locks. SQLite has neither.
func (m *members) bound(tx *gorm.DB, d time.Duration) error {
	if !m.postgres {
		return nil
	}
	ms := strconv.FormatInt(max(d.Milliseconds(), 1), 10)
	return tx.Exec(`SELECT set_config('lock_timeout', ?, true), set_config('idle_in_transaction_session_timeout', ?, true)`,
		ms, ms).Error
}

// fence fails with ErrFenced unless this member's row is live on the
// database's clock and the membership is still gen: one primary-key lookup
// in tx, run last before its commit.
func (m *members) fence(tx *gorm.DB, gen int64) error {
	if putBack == "fence" {
		return nil
	}
	var live int64
	if err := tx.Raw(`SELECT count(*) FROM consumer_members WHERE consumer = ? AND member_id = ? AND expires_ms >= `+m.now,
		m.group, m.id).Scan(&live).Error; err != nil {
		return err
	}
	if now := m.gen.Load(); live == 0 || now != gen {
		return fmt.Errorf("%w (member %s, membership %d, now %d, row live: %t)", ErrFenced, m.id, gen, now, live > 0)
	}
	return nil
}

// guards returns the hooks of a partitioned consumer's inbox transactions
// (inbox.Config BeginTx and BeforeCommit): the first bounds each
// transaction's lock waits and idle pauses to txTimeout(takeover) (see
// bound), the second fences its commit by the membership its partition
// worker was started under, and logs the refusals. On SQLite it returns
// none.
func (m *members) guards(takeover time.Duration, log *slog.Logger) (begin, beforeCommit func(*gorm.DB) error) {
	if !m.postgres {
		// One process owns an SQLite database and its in-memory bus: no
		// peer can take a partition over, and nothing needs fencing.
		return nil, nil
	}
	d := txTimeout(takeover)
	begin = func(tx *gorm.DB) error { return m.bound(tx, d) }
	beforeCommit = func(tx *gorm.DB) error {
		err := m.fence(tx, m.membershipOf(tx.Statement.Context))
		if errors.Is(err, ErrFenced) {
			log.Warn("consumer: membership ended; rolling back instead of committing, the messages go back to their queue",
				"group", m.group, "err", err)
		}
		return err
	}
	return begin, beforeCommit
}

// txTimeout is the lock timeout and idle-in-transaction timeout of a
// partitioned consumer's transactions on PostgreSQL: half of TakeoverTime.
// An instance that stops inside a transaction (frozen, or cut off from the
// database) loses that transaction, and the locks it holds on the inbox
// records and watermarks of its messages, before its membership expires
// (three quarters of TakeoverTime), so the peer that takes its partitions
// over is not blocked behind them.
func txTimeout(takeover time.Duration) time.Duration { return takeover / 2 }

// memberTTL is how long a heartbeat keeps a member's row live: three
// quarters of TakeoverTime.
func memberTTL(takeover time.Duration) time.Duration { return takeover * 3 / 4 }

// beatTimeout bounds each heartbeat, the interval between two: a database
// that hangs costs one beat, not the membership loop. (Half of it made a
// loaded host's beats time out, lapsing healthy memberships.)
func beatTimeout(takeover time.Duration) time.Duration { return takeover / 4 }

type membershipCtxKey struct{}

// withMembership records in ctx the membership a partition worker was
// started under.
func withMembership(ctx context.Context, gen int64) context.Context {
	return context.WithValue(ctx, membershipCtxKey{}, gen)
}

// membershipOf returns the membership recorded in ctx, or the current one.
func (m *members) membershipOf(ctx context.Context) int64 {
	if gen, ok := ctx.Value(membershipCtxKey{}).(int64); ok {
		return gen
	}
	return m.gen.Load()
}

// assign deals partitions 0..n-1 round-robin among the sorted member ids and
// returns those of member me.
func assign(n int, ids []string, me string) []int {
	i := slices.Index(ids, me)
	if i < 0 {
		return nil
	}
	var owned []int
	for p := i; p < n; p += len(ids) {
		owned = append(owned, p)
	}
	return owned
}

// leave deletes this member's row, so the others take its partitions at
// their next beat.
func (m *members) leave(ctx context.Context) error {
	return m.db.WithContext(ctx).Exec(`DELETE FROM consumer_members WHERE consumer = ? AND member_id = ?`,
		m.group, m.id).Error
}
