package dbbus

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// DeclareGroup binds consumer group to topic patterns, with the semantics
// of a RabbitMQ topic exchange ([messaging.MatchTopic]): an exact topic,
// "order.*" (one word), "order.#" (zero or more words). Messages published
// after it returns get a delivery row for the group when their topic
// matches any of its patterns. It adds the patterns to those the group
// already has and is idempotent. db may be a transaction.
//
// Errors: messaging.ErrInvalidName for a bad group or pattern, or for
// [UnroutableGroup], which takes no bindings.
func DeclareGroup(ctx context.Context, db *gorm.DB, group string, patterns ...string) error {
	if err := messaging.ValidateGroup(group); err != nil {
		return fmt.Errorf("dbbus: declare group: %w", err)
	}
	if group == UnroutableGroup {
		return fmt.Errorf("dbbus: declare group: %w: %q is reserved for unroutable messages", messaging.ErrInvalidName, group)
	}
	if err := messaging.ValidatePatterns(patterns); err != nil {
		return fmt.Errorf("dbbus: declare group: %w", err)
	}
	args := make([]any, 0, 2*len(patterns))
	for _, p := range patterns {
		args = append(args, group, p)
	}
	err := db.WithContext(ctx).Exec(`INSERT INTO dbbus_bindings (group_name, pattern) VALUES `+
		dialect.Tuples(len(patterns), 2)+` ON CONFLICT DO NOTHING`, args...).Error
	if err != nil {
		return wrapDB("declare group", err)
	}
	return nil
}

// Depth returns how many messages group holds: its ready deliveries and
// those leased to a subscriber and not yet acked. [UnroutableGroup] always
// exists.
//
// Errors: messaging.ErrQueueNotFound for a group never declared.
func Depth(ctx context.Context, db *gorm.DB, group string) (int, error) {
	if err := requireGroup(ctx, db, group); err != nil {
		return 0, err
	}
	var n int64
	if err := db.WithContext(ctx).Raw(`SELECT
	(SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? AND lease_token IS NULL) +
	(SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? AND lease_token IS NOT NULL)`, group, group).
		Scan(&n).Error; err != nil {
		return 0, wrapDB("depth", err)
	}
	return int(n), nil
}

// requireGroup returns messaging.ErrQueueNotFound unless group has a
// binding or is the unroutable group.
func requireGroup(ctx context.Context, db *gorm.DB, group string) error {
	if group == UnroutableGroup {
		return nil
	}
	var n int64
	if err := db.WithContext(ctx).Raw(`SELECT count(*) FROM dbbus_bindings WHERE group_name = ?`, group).
		Scan(&n).Error; err != nil {
		return wrapDB("read bindings", err)
	}
	if n == 0 {
		return fmt.Errorf("dbbus: %w: group %q is not declared", messaging.ErrQueueNotFound, group)
	}
	return nil
}
