package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
type members struct {
	db         *gorm.DB
	now        string // SQL for the database's clock in milliseconds
	group, id  string
	partitions int
}

func newMembers(db *gorm.DB, group string, partitions int) (*members, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	now := `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`
	if d == dialect.SQLite {
		now = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`
	}
	// Two consumers of a group in one process are two members.
	return &members{db: db, now: now, group: group, id: instance.ID(), partitions: partitions}, nil
}

// beat renews this member's row for ttlMillis, forgets expired members and
// returns the partitions this member owns now.
//
// Errors: ErrPartitionMismatch, or the database's error.
func (m *members) beat(ctx context.Context, ttlMillis int64) ([]int, error) {
	var owned []int
	err := m.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`INSERT INTO consumer_members (consumer, member_id, partitions, expires_ms)
VALUES (?, ?, ?, `+m.now+` + ?)
ON CONFLICT (consumer, member_id) DO UPDATE SET partitions = excluded.partitions, expires_ms = excluded.expires_ms`,
			m.group, m.id, m.partitions, ttlMillis).Error; err != nil {
			return err
		}
		if err := tx.Exec(`DELETE FROM consumer_members WHERE consumer = ? AND expires_ms < `+m.now, m.group).Error; err != nil {
			return err
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
